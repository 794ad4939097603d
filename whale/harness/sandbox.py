"""How the harness process is started: the one place that sets its limits.

A harness file is untrusted once a proposer writes it, so its process gets
* no network: a fresh network namespace (``unshare --net``; as a non-root user ``unshare -rn``),
  when the kernel allows it — otherwise only the in-process audit hook of ``whale.harness.worker``
  stands between the harness and a socket (logged once as a warning);
* rlimits: address space, CPU seconds, file size, core dumps off;
* an environment without credentials (a fixed allow list: nothing from the parent leaks through);
* a private empty working directory;
* wall timeouts per hook call and at start (enforced by ``whale.harness.process``).

``whale.sandbox`` (the project's generic sandboxed-subprocess primitive) is used when it provides
``spawn``; until then this module applies the same limits itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: variables copied into the harness environment (values fixed here, never read from the parent)
_SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one harness process (which serves many episodes)."""

    #: address-space limit (RLIMIT_AS)
    memory_bytes: int = 1 << 30
    #: CPU seconds over the process's whole life (RLIMIT_CPU); hooks are cheap string work
    cpu_seconds: int = 3600
    #: largest file the process may write (RLIMIT_FSIZE)
    file_size_bytes: int = 1 << 20
    #: wall seconds one hook call may take before the process is killed and restarted
    hook_timeout_s: float = 30.0
    #: wall seconds to start and load the harness
    start_timeout_s: float = 60.0
    #: largest JSON answer of one hook call
    max_response_bytes: int = 8 << 20
    #: tail of the process's stderr kept for error messages
    stderr_tail_bytes: int = 16 << 10
    #: isolate the network (a new network namespace) when the kernel allows it
    isolate_network: bool = True


@functools.cache
def _netns_prefix() -> tuple[str, ...]:
    """The argv prefix that gives a child its own (empty) network namespace here, or () if none works."""
    unshare = shutil.which("unshare")
    if not unshare:
        log.warning("harness sandbox: `unshare` not found; no network namespace (audit hook only)")
        return ()
    for prefix in ((unshare, "--net"), (unshare, "-rn")):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    log.warning("harness sandbox: cannot create a network namespace here; relying on the audit hook")
    return ()


def network_isolated() -> bool:
    """Whether harness processes get their own network namespace on this machine."""
    return bool(_netns_prefix())


def _set_limits(limits: SandboxLimits) -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()


def sandbox_env(workdir: Path) -> dict[str, str]:
    """The whole environment of a harness process: fixed values only, no credentials."""
    return {**_SAFE_ENV, "HOME": str(workdir), "TMPDIR": str(workdir)}


async def spawn(argv: list[str], limits: SandboxLimits) -> tuple[asyncio.subprocess.Process, Path]:
    """Start ``argv`` sandboxed with pipes on stdin/stdout/stderr; returns the process and its
    private working directory (the caller removes it). The single function that applies limits."""
    workdir = Path(tempfile.mkdtemp(prefix="whale-harness-"))
    prefix = _netns_prefix() if limits.isolate_network else ()
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=workdir,
        env=sandbox_env(workdir),
        preexec_fn=functools.partial(_set_limits, limits),
        limit=limits.max_response_bytes,
    )
    return proc, workdir


def worker_argv(harness_path: Path, allowed_imports: frozenset[str] | set[str]) -> list[str]:
    """``python -I -m whale.harness.worker FILE --allow a,b,c`` (-I: no PYTHON* variables, no cwd on the path)."""
    return [
        sys.executable,
        "-I",
        "-m",
        "whale.harness.worker",
        str(harness_path),
        "--allow",
        ",".join(sorted(allowed_imports)),
    ]
