"""The local-directory backend: the embedded default of ``whale run``.

Objects are plain files under the root, so a run can be inspected with ``ls`` and ``cat``. Writes go
to a hidden temporary file beside the target, are fsynced, then renamed over it (rename is atomic on
POSIX filesystems). Temporary files and empty folders are invisible to ``list``, and ``delete``
prunes the folders it empties, so listings match the S3 backend's.

A write the filesystem refuses raises a typed error naming the file: :class:`StoreFull` (ENOSPC,
EDQUOT), :class:`StoreReadOnly` (EROFS, EACCES, EPERM), with the fix. The run lock is an ``flock``
on its file (``whale.store.lease``): the only file here written in place, and read only for messages.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from whale.store.base import ObjectNotFound, Store, StoreError, StoreFull, StoreReadOnly, normalize_key
from whale.store.lease import Lease, LeaseHeld, LeaseHolder, LeaseInfo, LeaseLost

#: how long ``acquire_lease`` retries a lock that is busy (a `whale status` probe holds it for microseconds)
LOCK_BUSY_WAIT_S = 1.0
LOCK_BUSY_POLL_S = 0.02
_FULL = (errno.ENOSPC, errno.EDQUOT)
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def write_error(path: Path, exc: OSError) -> StoreError:
    """The typed error for a failed write of ``path``: what the filesystem said, and what to do."""
    uri = f"file://{path}"
    cause = f"{exc.strerror or exc} (errno {errno.errorcode.get(exc.errno or 0, exc.errno)})"
    if exc.errno in _FULL:
        return StoreFull(
            uri,
            cause,
            "free space on that filesystem (or raise the quota), or pass --store a "
            "folder with room; then run the same command again to resume",
        )
    if exc.errno == errno.EROFS:
        return StoreReadOnly(
            uri,
            cause,
            "the store folder is on a read-only mount: remount it read-write or pass --store a writable folder",
        )
    if exc.errno in _READ_ONLY:
        return StoreReadOnly(
            uri, cause, "give this user write permission on the store folder, or pass --store a writable folder"
        )
    return StoreError(f"cannot write {uri}: {cause}")


#: temporary files carry this prefix; ``list`` skips them (a crash can leave one behind)
TMP_PREFIX = ".whale-tmp-"


class LocalStore(Store):
    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_error(self.root, exc) from exc
        if not self.root.is_dir():
            raise StoreError(f"store root {self.root} exists and is not a directory")
        self.uri = f"file://{self.root}"

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _path(self, key: str, *, allow_root: bool = False) -> Path:
        return Path(self._resolved(key, allow_root=allow_root))

    def _resolved(self, key: str, *, allow_root: bool = False) -> str:
        """The key's file as a string, checked not to leave the store through a symlink. The root was resolved when
        the store was opened, so only the key's own components can be links: each is looked at (one ``lstat``, not
        ``os.path.realpath``'s walk from ``/``: a controller asks this many times a second) and a path that passes
        through a link is resolved in full and checked."""
        key = normalize_key(key, allow_root=allow_root)
        root = str(self.root)
        if not key:
            return root
        prefix = root.rstrip(os.sep)
        path = prefix
        for part in key.split("/"):
            path = f"{path}{os.sep}{part}"
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    real = os.path.realpath(f"{prefix}{os.sep}{key}")
                    if real != root and not real.startswith(prefix + os.sep):  # a symlink pointing outside
                        raise StoreError(f"key {key!r} escapes the store root {self.root} (through a symlink)")
                    return real
            except OSError:  # missing (or below a file): nothing further down exists to be a link
                break
        return f"{prefix}{os.sep}{key}"

    def local_path(self, key: str) -> Path:
        return self._path(key)

    def check(self) -> None:
        """A store we cannot write fails here, before any work (root is not stopped by file modes: ask the
        filesystem too)."""
        if os.statvfs(self.root).f_flag & os.ST_RDONLY:
            raise write_error(self.root, OSError(errno.EROFS, os.strerror(errno.EROFS)))
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise write_error(self.root, OSError(errno.EACCES, os.strerror(errno.EACCES)))

    # --- reads ---
    def read_bytes(self, key: str) -> bytes:
        try:
            with open(self._resolved(key), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(normalize_key(key), self.uri) from None
        except OSError as exc:
            raise StoreError(f"cannot read {self._path(key)}: {exc.strerror}") from exc

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise StoreError(f"read_range({key!r}): offset and length must be >= 0, got {offset}, {length}")
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(offset)
                return fh.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(normalize_key(key), self.uri) from None
        except OSError as exc:
            raise StoreError(f"cannot read {self._path(key)}: {exc.strerror}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str, recursive: bool = True) -> list[str]:
        base = self._resolved(prefix, allow_root=True)
        if not os.path.isdir(base):
            return []
        if recursive:
            return sorted(self._rel(p) for p in _files_under(Path(base)))
        # os.scandir and strings, not pathlib: a controller lists a run's phases and checkpoints many times a second
        root = str(self.root)
        here = base[len(root) :].strip(os.sep)
        out = []
        with os.scandir(base) as entries:
            for entry in entries:
                if entry.name.startswith(TMP_PREFIX):
                    continue
                rel = f"{here}/{entry.name}" if here else entry.name
                if entry.is_dir():
                    if _holds_a_file(entry.path):  # empty folders do not exist in S3
                        out.append(rel + "/")
                elif entry.is_file():
                    out.append(rel)
        return sorted(out)

    def usage(self, prefix: str) -> int:
        base = self._path(prefix, allow_root=True)
        if not base.is_dir():
            return 0
        total = 0
        for path in _files_under(base):
            try:
                total += path.stat().st_size
            except FileNotFoundError:  # deleted while listed
                pass
        return total

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # --- writes ---
    @contextmanager
    def _atomic(self, key: str) -> Iterator[BinaryIO]:
        """Yield a temp file beside the target; on success fsync and rename it over the target. Strings and ``os``
        calls, not pathlib and ``tempfile.mkstemp``: a controller writes several objects a second, and their path
        handling cost more than the write's own system calls; the folder is made only when it is missing."""
        path = self._resolved(key)
        if os.path.isdir(path):
            raise StoreError(f"cannot write {key!r}: it is a folder in {self.uri} (a key cannot be both)")
        parent, name = os.path.split(path)
        fd = -1
        try:
            for _ in range(5):
                # mkstemp's way (O_EXCL, mode 0600) with a shorter random name
                tmp = f"{parent}{os.sep}{TMP_PREFIX}{name}.{os.urandom(6).hex()}"
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                    break
                except FileNotFoundError:  # no folder yet (or a concurrent delete pruned it): make it, try again
                    os.makedirs(parent, exist_ok=True)
                except FileExistsError:
                    continue  # the name is taken: another one
            else:
                raise StoreError(f"cannot write {path}: its folder keeps disappearing (concurrent delete?)")
        except (FileExistsError, NotADirectoryError):
            raise StoreError(
                f"cannot write {key!r}: a parent of it is an object in {self.uri} (a key cannot be both)"
            ) from None
        except OSError as exc:
            raise write_error(Path(path), exc) from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(exc, OSError) and exc.errno in (*_FULL, *_READ_ONLY):
                raise write_error(Path(path), exc) from exc
            raise

    def write_bytes(self, key: str, data: bytes) -> None:
        with self._atomic(key) as fh:
            fh.write(data)

    def upload_file(self, path: Path, key: str) -> None:
        with open(path, "rb") as src, self._atomic(key) as fh:
            shutil.copyfileobj(src, fh, 1 << 20)

    @contextmanager
    def writing(self, key: str) -> Iterator[BinaryIO]:
        # straight into the temp file beside the target, renamed over it: the bytes are written once
        with self._atomic(key) as fh:
            yield fh

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
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise write_error(path, exc) from exc
        self._prune(path.parent)

    def delete_prefix(self, prefix: str) -> None:
        base = self._path(prefix, allow_root=True)
        if not base.is_dir():
            return
        for p in list(_files_under(base)):
            try:
                p.unlink(missing_ok=True)
            except OSError as exc:
                raise write_error(p, exc) from exc
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            _rmdir_if_empty(d)
        self._prune(base)

    def _prune(self, folder: Path) -> None:
        """Remove ``folder`` and its parents while they are empty, never the root."""
        while folder != self.root and self.root in folder.parents and _rmdir_if_empty(folder):
            folder = folder.parent

    # --- the run lock: an flock ---
    def acquire_lease(self, key: str, holder: LeaseHolder, ttl_s: float) -> Lease:
        """An exclusive flock on the file at ``key``; ``ttl_s`` is not needed (the kernel drops the lock
        with its last holder). Retries a busy lock for LOCK_BUSY_WAIT_S (a reader's probe), then refuses."""
        path = self._path(key)
        deadline = time.monotonic() + LOCK_BUSY_WAIT_S
        while True:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise write_error(path, exc) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() < deadline:
                    time.sleep(LOCK_BUSY_POLL_S)
                    continue
                info = self.read_lease(key) or LeaseInfo(self.uri_for(key), None, True)
                raise LeaseHeld(f"{info.uri} is held by {info.describe()}", info) from None
            if not _same_file(fd, path):  # unlinked or replaced while we waited: lock the file that is there now
                os.close(fd)
                continue
            try:
                data = (json.dumps(holder.to_wire(), sort_keys=True) + "\n").encode("utf-8")
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
                os.fsync(fd)
            except OSError as exc:
                os.close(fd)
                raise write_error(path, exc) from exc
            return _FlockLease(normalize_key(key), self.uri_for(key), holder, fd, path)

    def read_lease(self, key: str) -> LeaseInfo | None:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                live = False
            except BlockingIOError:
                live = True
            raw = os.pread(fd, 1 << 16, 0)
        finally:
            os.close(fd)
        holder = None
        if raw.strip():
            try:
                holder = LeaseHolder.from_wire(json.loads(raw))
            except (ValueError, KeyError, TypeError):
                holder = None  # being written this very moment, or damaged: the flock alone decides
        note = ""
        if live and holder is not None and holder.process_alive() is False:
            note = f"process {holder.pid} is gone, but a process it started (a workload?) still holds the lock"
        if not live:
            holder = None  # a released lock file keeps its last holder's text; nobody holds it
        return LeaseInfo(self.uri_for(key), holder, live, note)


class _FlockLease(Lease):
    def __init__(self, key: str, uri: str, holder: LeaseHolder, fd: int, path: Path):
        self.key, self.uri, self.holder, self.fd, self.path = key, uri, holder, fd, path
        self.inherit_fds = (fd,)
        self.released = False

    def check(self) -> None:
        if self.released:
            raise LeaseLost(f"{self.uri}: this lease was released")
        if not _same_file(self.fd, self.path):
            raise LeaseLost(f"{self.uri} was deleted or replaced while this process held it")

    def renew(self) -> None:
        self.check()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            if _same_file(self.fd, self.path):
                os.ftruncate(self.fd, 0)  # readers see no holder; the empty file stays for the next one
        except OSError:
            pass  # a full or read-only store: closing the descriptor below releases the lock all the same
        finally:
            os.close(self.fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _files_under(base: Path) -> Iterator[Path]:
    for dirpath, _dirnames, filenames in os.walk(base):
        for name in filenames:
            if not name.startswith(TMP_PREFIX):
                yield Path(dirpath, name)


def _holds_a_file(folder: str) -> bool:
    """Whether :func:`_files_under` the folder yields anything (os.walk's files: whatever is not a folder, folder
    links not followed), without building its paths."""
    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if not entry.is_dir():
                        if not entry.name.startswith(TMP_PREFIX):
                            return True
                    elif not entry.is_symlink():
                        stack.append(entry.path)
        except OSError:  # gone meanwhile, or unreadable: os.walk skips it too
            continue
    return False


def _rmdir_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()
        return True
    except OSError:  # not empty (or already gone / raced by a writer): leave it
        return False
