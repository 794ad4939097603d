"""The local-directory backend: the embedded default of ``whale run``.

Objects are plain files under the root, so a run can be inspected with ``ls`` and ``cat``. Writes go
to a hidden temporary file beside the target, are fsynced, then renamed over it (rename is atomic on
POSIX filesystems). Temporary files and empty folders are invisible to ``list``, and ``delete``
prunes the folders it empties, so listings match the S3 backend's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from whale.store.base import ObjectNotFound, Store, StoreError, normalize_key

#: temporary files carry this prefix; ``list`` skips them (a crash can leave one behind)
TMP_PREFIX = ".whale-tmp-"


class LocalStore(Store):
    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {self.root}: {exc.strerror}") from exc
        if not self.root.is_dir():
            raise StoreError(f"store root {self.root} exists and is not a directory")
        self.uri = f"file://{self.root}"

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _path(self, key: str, *, allow_root: bool = False) -> Path:
        key = normalize_key(key, allow_root=allow_root)
        path = (self.root / key).resolve() if key else self.root
        if path != self.root and self.root not in path.parents:  # a symlink pointing outside
            raise StoreError(f"key {key!r} escapes the store root {self.root} (through a symlink)")
        return path

    def local_path(self, key: str) -> Path:
        return self._path(key)

    def check(self) -> None:
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StoreError(f"store directory {self.root} is not writable by this user")

    # --- reads ---
    def read_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(normalize_key(key), self.uri) from None
        except OSError as exc:
            raise StoreError(f"cannot read {self._path(key)}: {exc.strerror}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str, recursive: bool = True) -> list[str]:
        base = self._path(prefix, allow_root=True)
        if not base.is_dir():
            return []
        if recursive:
            return sorted(self._rel(p) for p in _files_under(base))
        out = []
        for p in base.iterdir():
            if p.name.startswith(TMP_PREFIX):
                continue
            if p.is_dir():
                if next(_files_under(p), None) is not None:  # empty folders do not exist in S3
                    out.append(self._rel(p) + "/")
            elif p.is_file():
                out.append(self._rel(p))
        return sorted(out)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # --- writes ---
    @contextmanager
    def _atomic(self, key: str) -> Iterator[BinaryIO]:
        """Yield a temp file beside the target; on success fsync and rename it over the target."""
        path = self._path(key)
        if path.is_dir():
            raise StoreError(f"cannot write {key!r}: it is a folder in {self.uri} (a key cannot be both)")
        try:
            for _ in range(3):  # a concurrent delete may prune the fresh parent folder: make it again
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent)
                    break
                except FileNotFoundError:
                    continue
            else:
                raise StoreError(f"cannot write {path}: its folder keeps disappearing (concurrent delete?)")
        except (FileExistsError, NotADirectoryError):
            raise StoreError(
                f"cannot write {key!r}: a parent of it is an object in {self.uri} (a key cannot be both)"
            ) from None
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def write_bytes(self, key: str, data: bytes) -> None:
        with self._atomic(key) as fh:
            fh.write(data)

    def upload_file(self, path: Path, key: str) -> None:
        with open(path, "rb") as src, self._atomic(key) as fh:
            shutil.copyfileobj(src, fh, 1 << 20)

    def download_file(self, key: str, path: Path) -> Path:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(normalize_key(key), self.uri)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.whale-download")
        shutil.copyfile(src, tmp)
        tmp.replace(path)
        return path

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            return  # a folder is not an object; nothing to delete (S3 behaves the same)
        path.unlink(missing_ok=True)
        self._prune(path.parent)

    def delete_prefix(self, prefix: str) -> None:
        base = self._path(prefix, allow_root=True)
        if not base.is_dir():
            return
        for p in list(_files_under(base)):
            p.unlink(missing_ok=True)
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            _rmdir_if_empty(d)
        self._prune(base)

    def _prune(self, folder: Path) -> None:
        """Remove ``folder`` and its parents while they are empty, never the root."""
        while folder != self.root and self.root in folder.parents and _rmdir_if_empty(folder):
            folder = folder.parent


def _files_under(base: Path) -> Iterator[Path]:
    for dirpath, _dirnames, filenames in os.walk(base):
        for name in filenames:
            if not name.startswith(TMP_PREFIX):
                yield Path(dirpath, name)


def _rmdir_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()
        return True
    except OSError:  # not empty (or already gone / raced by a writer): leave it
        return False
