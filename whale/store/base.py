"""The storage client interface. Keys are '/'-separated paths relative to the store root
(``whale.layout`` builds them). Every write is atomic: a reader sees the old object or the new one,
never half of one."""

from __future__ import annotations

import abc
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class StoreError(RuntimeError):
    """Base of every storage failure; the message says what to do."""


class ObjectNotFound(StoreError, KeyError):
    def __init__(self, key: str, where: str = ""):
        self.key = key
        super().__init__(f"no object {key!r}{' in ' + where if where else ''}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


class StoreAuthError(StoreError):
    """Credentials rejected: permanent, retrying will not help."""


class StoreUnavailable(StoreError):
    """The server could not be reached after the retry budget: temporary."""


class Store(abc.ABC):
    """All object-store I/O of WHALE goes through one of these."""

    #: the root this store was opened at, e.g. ``file:///data/whale`` or ``s3://bucket/prefix``
    uri: str

    # --- primitives each backend implements ---
    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Atomic replace."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str, recursive: bool = True) -> list[str]:
        """Keys under ``prefix`` (a folder path, with or without the trailing '/'), sorted.
        With ``recursive=False``: the direct children, folders ending in '/'."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; missing is fine."""

    # --- derived helpers, shared by every backend ---
    def uri_for(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode("utf-8")

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode("utf-8"))

    def read_json(self, key: str) -> Any:
        return json.loads(self.read_bytes(key))

    def read_json_or_none(self, key: str) -> Any | None:
        try:
            return self.read_json(key)
        except ObjectNotFound:
            return None

    def write_json(self, key: str, obj: Any) -> None:
        self.write_bytes(key, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    def read_jsonl(self, key: str) -> list[dict[str, Any]]:
        """All records; a missing file is an empty list (a phase that has not logged yet)."""
        try:
            raw = self.read_bytes(key)
        except ObjectNotFound:
            return []
        return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]

    def append_jsonl(self, key: str, records: Iterable[dict[str, Any]] | dict[str, Any]) -> None:
        """Append records as one atomic rewrite (objects are immutable in S3; one writer per file)."""
        if isinstance(records, dict):
            records = [records]
        lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
        try:
            current = self.read_bytes(key)
        except ObjectNotFound:
            current = b""
        self.write_bytes(key, current + lines.encode("utf-8"))

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)

    def upload_dir(self, local_dir: Path, prefix: str, marker: str | None = None) -> None:
        """Copy a local folder under ``prefix``; ``marker`` (e.g. COMPLETE) is written last, so a
        reader that waits for the marker never sees a partial folder."""
        local_dir = Path(local_dir)
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            self.write_bytes(f"{prefix.rstrip('/')}/{path.relative_to(local_dir).as_posix()}", path.read_bytes())
        if marker:
            self.write_bytes(f"{prefix.rstrip('/')}/{marker}", b"")

    def download_dir(self, prefix: str, local_dir: Path) -> Path:
        local_dir = Path(local_dir)
        prefix = prefix.rstrip("/") + "/"
        keys = self.list(prefix)
        if not keys:
            raise ObjectNotFound(prefix, self.uri)
        for key in keys:
            dest = local_dir / key[len(prefix):]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self.read_bytes(key))
        return local_dir

    def local_path(self, key: str) -> Path | None:
        """A filesystem path for ``key`` when the backend has one (local store), else None."""
        return None


def open_store(uri: str, **options: Any) -> Store:
    """``/dir``, ``file:///dir`` -> LocalStore; ``s3://bucket[/prefix]`` -> S3Store(options)."""
    if uri.startswith("s3://"):
        from whale.store.s3 import S3Store

        return S3Store.from_uri(uri, **options)
    from whale.store.local import LocalStore

    path = uri[len("file://"):] if uri.startswith("file://") else uri
    return LocalStore(Path(path))
