"""Run untrusted Python (model-written tool code, proposer-written harness files) in a sandbox.

Two shapes:

* :func:`run_python` — one program, one process: ``run_python("print(1)")`` → :class:`SandboxResult`
  with a typed :class:`Outcome` (ok / error / timeout / cpu_limit / memory_limit / output_limit /
  file_size_limit / killed / sandbox_error), bounded stdout/stderr and the isolation achieved.
* :class:`SandboxWorker` — a long-lived sandboxed process that loads an entry file once and serves
  JSON calls over pipes (``worker.call("fn", *args)``), for hooks called many times per episode.

Isolation (see ``docs/metaharness.md`` § Sandbox): a fresh network namespace (fallback: a
socket-blocking audit hook, with a warning), a fresh unprivileged uid per sandbox when run as root,
a private mount namespace hiding /tmp, /dev/shm, /root, /home and secret mounts behind empty
tmpfs (the scratch directory stays writable), rlimits (CPU, address space, file size, processes,
open files), a wall clock that kills the whole process tree, and an allow-listed environment.
"""

from whale.sandbox.policy import GiB, Isolation, IsolationLevel, Limits, MiB, Outcome, build_env, classify
from whale.sandbox.process import SandboxSetupError
from whale.sandbox.run import SandboxResult, run_python
from whale.sandbox.worker import SandboxCallError, SandboxWorker

__all__ = [
    "GiB",
    "Isolation",
    "IsolationLevel",
    "Limits",
    "MiB",
    "Outcome",
    "SandboxCallError",
    "SandboxResult",
    "SandboxSetupError",
    "SandboxWorker",
    "build_env",
    "classify",
    "run_python",
]
