"""The local-directory backend: the embedded default of ``whale run``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from whale.store.base import ObjectNotFound, Store, StoreError


class LocalStore(Store):
    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {self.root}: {exc.strerror}") from exc
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        key = key.strip("/")
        path = (self.root / key).resolve()
        if path != self.root and self.root not in path.parents:
            raise StoreError(f"key {key!r} escapes the store root")
        return path

    def local_path(self, key: str) -> Path:
        return self._path(key)

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key, self.uri) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write beside the target, fsync, then rename: readers see the old or the new file, never half.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str, recursive: bool = True) -> list[str]:
        base = self._path(prefix) if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        if recursive:
            found = [p for p in base.rglob("*") if p.is_file() and not p.name.endswith(".tmp")]
            return sorted(p.relative_to(self.root).as_posix() for p in found)
        out = []
        for p in base.iterdir():
            rel = p.relative_to(self.root).as_posix()
            if p.is_dir():
                out.append(rel + "/")
            elif not p.name.endswith(".tmp"):
                out.append(rel)
        return sorted(out)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
