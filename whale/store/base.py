"""The storage client interface, shared by the local-directory and the S3 backend.

Keys are '/'-separated paths relative to the store root (``whale.core.layout`` builds them). The
guarantees every backend keeps, and that ``docs/storage.md`` documents:

- every write is atomic: a reader sees the old object or the new one, never half of one;
- a folder written with ``upload_dir(..., marker=M)`` is complete once ``M`` exists;
- failures are typed: :class:`ObjectNotFound` (missing key), :class:`StoreAuthError` (credentials
  rejected, permanent), :class:`StoreUnavailable` (server unreachable after the retry budget,
  temporary), :class:`StoreFull` / :class:`StoreReadOnly` (a write the store refused: no space or
  quota left, a read-only mount, no write permission; permanent until someone fixes the store),
  :class:`StoreError` (anything else); the message names the object's URI, the cause and the fix;
- one key can be held as a lease (:meth:`Store.acquire_lease`, ``whale.store.lease``): the local
  runner's run lock.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import json
import posixpath
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from whale.store.lease import Lease, LeaseHolder, LeaseInfo


class StoreError(RuntimeError):
    """Base of every storage failure; the message says what to do."""


class ObjectNotFound(StoreError, KeyError):
    """The key (or, for ``download_dir``, the folder) does not exist."""

    def __init__(self, key: str, where: str = ""):
        self.key = key
        super().__init__(f"no object {key!r}{' in ' + where if where else ''}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


class StoreAuthError(StoreError):
    """Credentials rejected: permanent, retrying will not help.

    ``code`` is the store's error code when it is one the client knows (``InvalidAccessKeyId``,
    ``SignatureDoesNotMatch``, ``AccessDenied``, ``HTTP 403`` ...), never the server's own text: the message may carry
    whatever an endpoint answered, so what is shown to someone who could name that endpoint is the code alone."""

    code: str | None = None


class StoreUnavailable(StoreError):
    """The server could not be reached after the retry budget: temporary."""

    def __init__(self, message: str, *, endpoint: str = "", attempts: int = 0, elapsed_s: float = 0.0):
        self.endpoint = endpoint
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        super().__init__(message)


class StoreWriteError(StoreError):
    """The store refused a write; retrying will not help until someone fixes the store.

    ``uri`` is the object (or folder) that could not be written, ``cause`` what the store said."""

    def __init__(self, uri: str, cause: str, fix: str):
        self.uri, self.cause, self.fix = uri, cause, fix
        super().__init__(f"cannot write {uri}: {cause}. Fix: {fix}")


class StoreFull(StoreWriteError):
    """No space (or quota) left where the object goes."""


class StoreReadOnly(StoreWriteError):
    """The store is read-only here: a read-only mount, no write permission, or an S3 key without write access."""


class StoreWriteDenied(StoreReadOnly, StoreAuthError):
    """S3 answered AccessDenied to a write: the key is valid (or not) but may not write there."""

    code = "AccessDenied"


def normalize_key(key: str, *, allow_root: bool = False) -> str:
    """The canonical form of a key: no leading/trailing '/', no '.' or empty segments, '..' resolved.

    Both backends use it, so ``a//b``, ``/a/b/`` and ``a/./b`` name the same object everywhere and a
    key can never reach outside the store root. ``allow_root`` admits the empty key (the root itself,
    meaningful only as a listing prefix).
    """
    if not isinstance(key, str):
        raise StoreError(f"store keys are strings, got {type(key).__name__} {key!r}")
    if "\x00" in key or "\\" in key:
        raise StoreError(f"key {key!r} contains a NUL or a backslash; use '/'-separated names")
    parts: list[str] = []
    for part in key.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise StoreError(f"key {key!r} escapes the store root: remove the leading '..'")
            parts.pop()
            continue
        parts.append(part)
    out = "/".join(parts)
    if not out and not allow_root:
        raise StoreError(f"key {key!r} names the store root, not an object: give a path like 'runs/<run>/...'")
    return out


def join_key(prefix: str, name: str) -> str:
    """``join_key("a/b/", "c")`` -> ``"a/b/c"``; an empty prefix is the root."""
    prefix = normalize_key(prefix, allow_root=True)
    return posixpath.join(prefix, name) if prefix else name


class Store(abc.ABC):
    """All object-store I/O of WHALE goes through one of these."""

    #: the root this store was opened at, e.g. ``file:///data/whale`` or ``s3://bucket/prefix``
    uri: str

    # --- primitives each backend implements ---
    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The whole object; :class:`ObjectNotFound` when missing (or when ``key`` is a folder)."""

    @abc.abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Atomic create-or-replace."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """True for an object; False for a missing key or a folder."""

    @abc.abstractmethod
    def list(self, prefix: str, recursive: bool = True) -> list[str]:
        """Keys under ``prefix`` (a folder path, with or without the trailing '/'; '' is the root), sorted.
        With ``recursive=False``: the direct children, folders ending in '/' (only folders that hold
        at least one object). A prefix that is no folder gives []."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; missing is fine."""

    @abc.abstractmethod
    def usage(self, prefix: str) -> int:
        """Bytes of the objects under the folder ``prefix`` (0 for none): what `whale list` shows per run."""

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """At most ``length`` bytes of the object from ``offset`` (fewer at its end, b"" past it);
        :class:`ObjectNotFound` when missing. Backends override it to read only that part (a log followed
        by `whale logs` is read in bounded pieces)."""
        if offset < 0 or length < 0:
            raise StoreError(f"read_range({key!r}): offset and length must be >= 0, got {offset}, {length}")
        return self.read_bytes(key)[offset : offset + length]

    def check(self) -> None:
        """Fail fast, with the typed error, when the store is unreachable or the credentials are wrong.
        Controllers call it once at start so a typo surfaces before any work is done."""

    # --- file transfer; backends override to stream instead of holding the file in memory ---
    def upload_file(self, path: Path, key: str) -> None:
        """Atomically store the content of a local file under ``key``."""
        self.write_bytes(key, Path(path).read_bytes())

    @contextlib.contextmanager
    def writing(self, key: str) -> Iterator[BinaryIO]:
        """A binary file whose content is stored under ``key`` atomically when the block ends without an error
        (nothing is stored otherwise), for a writer too big to hold in memory. Here, a temporary local file
        then :meth:`upload_file`; the local folder writes in place (the bytes written once, not copied)."""
        with tempfile.TemporaryDirectory(prefix="whale-write-") as tmp:
            path = Path(tmp) / "object"
            with open(path, "wb") as fh:
                yield fh
            self.upload_file(path, key)

    def download_file(self, key: str, path: Path) -> Path:
        """Write the object to ``path`` (replaced atomically; parent folders created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.whale-download")
        tmp.write_bytes(self.read_bytes(key))
        tmp.replace(path)
        return path

    # --- derived helpers, shared by every backend ---
    def uri_for(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{normalize_key(key)}"

    def read_text(self, key: str) -> str:
        return self._decode(key, self.read_bytes(key))

    def _decode(self, key: str, raw: bytes) -> str:
        """UTF-8 text of an object; bytes that are not UTF-8 raise a StoreError naming the object."""
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise StoreError(
                f"{self.uri_for(key)} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}, offset "
                f"{exc.start}); it was not written by whale: restore or delete it"
            ) from None

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode("utf-8"))

    def read_json(self, key: str) -> Any:
        text = self._decode(key, self.read_bytes(key))
        try:
            return json.loads(text)
        except ValueError as exc:
            raise StoreError(f"{self.uri_for(key)} is not valid JSON ({exc}); rewrite or delete it") from None
        except RecursionError:
            raise StoreError(
                f"{self.uri_for(key)} is nested too deeply to read as JSON; rewrite or delete it"
            ) from None

    def read_json_or_none(self, key: str) -> Any | None:
        try:
            return self.read_json(key)
        except ObjectNotFound:
            return None

    def write_json(self, key: str, obj: Any) -> None:
        self.write_bytes(key, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    def read_jsonl(self, key: str) -> builtins.list[dict[str, Any]]:  # `list` here is the method above
        """All records; a missing file is an empty list (a phase that has not logged yet)."""
        try:
            raw = self.read_bytes(key)
        except ObjectNotFound:
            return []
        records = []
        for lineno, line in enumerate(self._decode(key, raw).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise StoreError(f"{self.uri_for(key)} line {lineno} is not valid JSON ({exc})") from None
            except RecursionError:
                raise StoreError(f"{self.uri_for(key)} line {lineno} is nested too deeply to read as JSON") from None
        return records

    def append_jsonl(self, key: str, records: Iterable[dict[str, Any]] | dict[str, Any]) -> None:
        """Append records as one atomic rewrite (objects are immutable in S3; one writer per file).

        A reader sees all of an append or none of it, never a torn line."""
        if isinstance(records, dict):
            records = [records]
        lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
        try:
            current = self.read_bytes(key)
        except ObjectNotFound:
            current = b""
        if current and not current.endswith(b"\n"):
            current += b"\n"
        self.write_bytes(key, current + lines.encode("utf-8"))

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under the folder ``prefix``."""
        for key in self.list(prefix):
            self.delete(key)

    def upload_dir(self, local_dir: Path, prefix: str, marker: str | None = None) -> None:
        """Copy a local folder under ``prefix``; ``marker`` (e.g. COMPLETE) is removed first and written
        last, so a reader that waits for the marker never sees a partial or half-replaced folder."""
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise StoreError(f"upload_dir: {local_dir} is not a directory")
        if marker:
            self.delete(join_key(prefix, marker))
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(local_dir).as_posix()
            if marker and rel == marker:
                continue  # written last, below
            self.upload_file(path, join_key(prefix, rel))
        if marker:
            self.write_bytes(join_key(prefix, marker), b"")

    def download_dir(self, prefix: str, local_dir: Path, marker: str | None = None) -> Path:
        """Copy every object under the folder ``prefix`` into ``local_dir``.

        With ``marker``: refuse (ObjectNotFound naming the marker) unless the folder is complete."""
        local_dir = Path(local_dir)
        root = normalize_key(prefix, allow_root=True)
        if marker and not self.exists(join_key(root, marker)):
            raise ObjectNotFound(join_key(root, marker), self.uri)
        keys = self.list(root)
        if not keys:
            raise ObjectNotFound(root + "/", self.uri)
        strip = len(root) + 1 if root else 0
        for key in keys:
            self.download_file(key, local_dir / key[strip:])
        return local_dir

    def local_path(self, key: str) -> Path | None:
        """A filesystem path for ``key`` when the backend has one (local store), else None."""
        return None

    # --- leases (the run lock) ---
    def acquire_lease(self, key: str, holder: LeaseHolder, ttl_s: float) -> Lease:
        """Hold ``key`` exclusively for ``holder`` until :meth:`Lease.release` (or, on S3, until ``ttl_s``
        passes without a renewal); :class:`LeaseHeld` naming the holder when another live one has it."""
        raise StoreError(f"{type(self).__name__} cannot hold leases")

    def read_lease(self, key: str) -> LeaseInfo | None:
        """Who holds the lease at ``key`` and whether it is live; None when nobody ever took it."""
        raise StoreError(f"{type(self).__name__} cannot hold leases")


def open_store(uri: str, **options: Any) -> Store:
    """``/dir``, ``file:///dir`` -> LocalStore; ``s3://bucket[/prefix]`` -> S3Store(options).

    S3 options (each falls back to an environment variable, see ``whale.store.s3``): endpoint,
    access_key, secret_key, session_token, secure, region, retry_deadline_s."""
    if not isinstance(uri, str) or not uri.strip():
        raise StoreError("empty store URI: give a directory, file:///dir or s3://bucket/prefix")
    if uri.startswith("s3://"):
        from whale.store.s3 import S3Store

        return S3Store.from_uri(uri, **options)
    if "://" in uri and not uri.startswith("file://"):
        raise StoreError(f"store URI {uri!r}: unsupported scheme; use a directory, file:///dir or s3://bucket/prefix")
    from whale.store.local import LocalStore

    path = uri[len("file://") :] if uri.startswith("file://") else uri
    return LocalStore(Path(path))
