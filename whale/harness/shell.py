"""The proposer's ``run_shell`` command, run here or on the run's harness host: one place for its limits.

One bash command in a fresh ``whale.sandbox`` run whose working directory is the archive copy, with the
agent's candidates at ``$CANDIDATES`` and a bounded scratch as HOME: rlimits (:func:`shell_limits`), the
allow-listed environment, the output cap, the whole process group killed at the wall clock.

Where it runs (:func:`shell_isolation`):

* ``namespaces``: the sandbox's kernel walls, the archive and candidates mounted read-only (here, or on a
  harness host at that level);
* ``pod``: only on the harness host (:mod:`whale.harness.host`), without kernel namespaces — the harness pod
  is the wall (no credentials, no token, no egress). The archive and candidates are a fresh extraction of
  the caller's snapshot (:func:`pack` / :func:`unpack`) for this one call, removed afterwards, so a write
  to them changes nothing the next call or the search loop sees;
* ``none``: trusted local use (no walls beyond rlimits and the environment).

The snapshot a caller sends is a gzip'd tar of ``archive/`` and ``candidates/``: regular files and
directories only (links are left out when packing and refused when unpacking), every name relative and
inside its root, at most :data:`MAX_SNAPSHOT_BYTES` compressed, :data:`MAX_SNAPSHOT_EXTRACTED_BYTES`
extracted and :data:`MAX_SNAPSHOT_MEMBERS` entries. It is sent with every call (no cache on the host: at
``pod`` a cached copy would be writable by the commands that read it).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

#: run_shell: default and largest wall clock of one command, the output kept, the command's length
SHELL_TIMEOUT_S = 30.0
SHELL_MAX_TIMEOUT_S = 120.0
SHELL_OUTPUT_BYTES = 32_000
SHELL_COMMAND_CHARS = 8_000
#: run_shell's process limits: address space per process, processes, its scratch (HOME, TMPDIR)
SHELL_MEMORY_BYTES = 2 << 30
SHELL_PROCESSES = 64
SHELL_SCRATCH_BYTES = 64 << 20
#: the snapshot of the archive and the candidates sent to the harness host: compressed, extracted, entries
MAX_SNAPSHOT_BYTES = 64 << 20
MAX_SNAPSHOT_EXTRACTED_BYTES = 256 << 20
MAX_SNAPSHOT_MEMBERS = 20_000
#: the two roots of a snapshot
ARCHIVE_ROOT, CANDIDATES_ROOT = "archive", "candidates"

#: the program run_shell starts in its sandbox: bash in the archive copy (the walls are the sandbox's)
_SHELL_DRIVER = """import os, sys
os.chdir(sys.argv[2])
os.execv("/bin/bash", ["bash", "-c", sys.argv[1]])
"""


class SnapshotError(ValueError):
    """A snapshot over a bound, or with an entry that is not a plain file or directory inside its root."""


def check_command(command: Any) -> str:
    """The command, or ValueError naming what is wrong with it."""
    if not isinstance(command, str) or not command.strip():
        raise ValueError("`command` must be a non-empty string")
    if len(command) > SHELL_COMMAND_CHARS:
        raise ValueError(f"the command is {len(command)} characters; at most {SHELL_COMMAND_CHARS}")
    if "\0" in command:
        raise ValueError("the command contains a NUL byte")
    return command


def wall_clock(timeout_s: Any, cap_s: float = SHELL_MAX_TIMEOUT_S) -> float:
    """The command's wall clock: ``timeout_s`` between 1 s and ``cap_s`` (a bad value: the default)."""
    ok = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool) and timeout_s == timeout_s
    return min(max(float(timeout_s) if ok else SHELL_TIMEOUT_S, 1.0), cap_s)


def shell_limits(wall_s: float) -> Any:
    from whale.sandbox import Limits

    return Limits(
        wall_s=wall_s,
        cpu_s=int(wall_s) + 1,
        memory_bytes=SHELL_MEMORY_BYTES,
        processes=SHELL_PROCESSES,
        stdout_bytes=SHELL_OUTPUT_BYTES,
        stderr_bytes=SHELL_OUTPUT_BYTES // 4,
        scratch_bytes=SHELL_SCRATCH_BYTES,
    )


def shell_isolation(level: str, read_paths: tuple[str, ...]) -> Any:
    """``none`` (trusted local use) and ``pod-host`` (the harness host at ``pod``: the pod is the wall): no kernel
    namespaces. Any other level (``namespaces``, and ``pod`` anywhere but the harness host, which never runs a
    command unwalled): the kernel walls, ``read_paths`` read-only."""
    from whale.sandbox import Isolation

    if level in ("none", "pod-host"):
        return Isolation.none()
    return Isolation(read_paths=read_paths)


def run_command(
    command: str, archive_dir: Path, candidates_dir: Path | None, wall_s: float, *, level: str = "namespaces"
) -> str:
    """Run one checked command; the agent's answer text (``exit: ...`` then its output). ``level``:
    ``namespaces``, ``none``, or ``pod-host`` (the harness host at ``pod``: no namespaces, the pod is the wall).
    Raises ``whale.sandbox.SandboxSetupError`` when the sandbox cannot start (fail closed)."""
    from whale.sandbox import Outcome, run_python

    read = [str(archive_dir)]
    if candidates_dir is not None and candidates_dir.is_dir():
        read.append(str(candidates_dir))
    result = run_python(
        _SHELL_DRIVER,
        args=[command, str(archive_dir)],
        limits=shell_limits(wall_s),
        isolation=shell_isolation(level, tuple(read)),
        env={"CANDIDATES": str(candidates_dir or "")},
    )
    parts = [f"exit: {result.returncode if result.returncode is not None else result.outcome.value}"]
    if result.outcome is Outcome.TIMEOUT:
        parts[0] = f"exit: stopped after {wall_s:g} s (timeout_s)"
    elif result.outcome is Outcome.OUTPUT_LIMIT:
        parts[0] = f"exit: stopped: the output passed {SHELL_OUTPUT_BYTES} bytes (use head, grep or wc)"
    elif result.outcome.is_limit:
        parts[0] = f"exit: stopped by the sandbox's {result.outcome.value}"
    if result.stdout:
        parts.append(result.stdout)
    if result.stderr.strip():
        parts.append("[stderr]\n" + result.stderr[-(SHELL_OUTPUT_BYTES // 4) :])
    return "\n".join(parts)


# ----- the snapshot sent to the harness host ---------------------------------------------------------


def pack(archive_dir: Path, candidates_dir: Path | None) -> bytes:
    """The archive copy and the candidates as one bounded tar.gz (see the module doc); SnapshotError over a
    bound. Links and anything but plain files and directories are left out (never followed)."""
    buffer = io.BytesIO()
    members = 0
    extracted = 0
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for root_name, source in ((ARCHIVE_ROOT, archive_dir), (CANDIDATES_ROOT, candidates_dir)):
            if source is None or not source.is_dir():
                continue
            for dirpath, dirnames, filenames in os.walk(source):  # os.walk does not follow directory links
                rel = Path(dirpath).relative_to(source)
                for name in sorted(dirnames) + sorted(filenames):
                    path = Path(dirpath) / name
                    st = path.lstat()
                    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                        continue
                    members += 1
                    extracted += st.st_size if stat.S_ISREG(st.st_mode) else 0
                    if members > MAX_SNAPSHOT_MEMBERS or extracted > MAX_SNAPSHOT_EXTRACTED_BYTES:
                        raise SnapshotError(
                            f"the archive and candidates hold more than {MAX_SNAPSHOT_MEMBERS} entries or "
                            f"{MAX_SNAPSHOT_EXTRACTED_BYTES} bytes: too large to send to the harness host"
                        )
                    info = tar.gettarinfo(str(path), arcname=f"{root_name}/{(rel / name).as_posix()}")
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if info.isreg():
                        with path.open("rb") as handle:
                            tar.addfile(info, handle)
                    else:
                        tar.addfile(info)
            tar.addfile(_dir_info(root_name))
    data = buffer.getvalue()
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"the archive snapshot is {len(data)} bytes compressed; at most {MAX_SNAPSHOT_BYTES}")
    return data


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info


def unpack(data: bytes, dest: Path) -> tuple[Path, Path]:
    """Extract an untrusted snapshot under ``dest``: the archive and candidates directories. Every entry is
    checked first (plain files and directories only, names inside ``archive/`` or ``candidates/``, the bounds
    of the module doc); SnapshotError names the first one that is not."""
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"the archive snapshot is {len(data)} bytes; at most {MAX_SNAPSHOT_BYTES}")
    archive, candidates = dest / ARCHIVE_ROOT, dest / CANDIDATES_ROOT
    archive.mkdir(parents=True, exist_ok=True)
    candidates.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members: list[tarfile.TarInfo] = []
            extracted = 0
            for info in tar:  # read header by header: a member count over the bound stops here
                if len(members) >= MAX_SNAPSHOT_MEMBERS:
                    raise SnapshotError(f"the snapshot has more than {MAX_SNAPSHOT_MEMBERS} entries")
                name = PurePosixPath(info.name)
                if (
                    name.is_absolute()
                    or ".." in name.parts
                    or name.parts[:1] not in ((ARCHIVE_ROOT,), (CANDIDATES_ROOT,))
                ):
                    raise SnapshotError(f"snapshot entry {info.name[:200]!r} is outside archive/ and candidates/")
                if not (info.isreg() or info.isdir()):
                    raise SnapshotError(f"snapshot entry {info.name[:200]!r} is not a plain file or directory")
                extracted += info.size if info.isreg() else 0
                if extracted > MAX_SNAPSHOT_EXTRACTED_BYTES:
                    raise SnapshotError(f"the snapshot extracts to more than {MAX_SNAPSHOT_EXTRACTED_BYTES} bytes")
                members.append(info)
            for info in members:
                target = dest.joinpath(*PurePosixPath(info.name).parts)
                if info.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(info)
                if source is None:
                    raise SnapshotError(f"snapshot entry {info.name[:200]!r} has no content")
                with source, open(target, "xb") as out:
                    out.write(source.read(info.size))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise SnapshotError(f"the snapshot is not a readable tar.gz: {exc}") from None
    return archive, candidates
