"""Run untrusted Python (model-written tool code, proposer-written harness files) behind an allow-list wall.

Three entry points:

* :func:`run_python` — one program, one process: ``run_python("print(1)")`` → :class:`SandboxResult`
  with a typed :class:`Outcome` (ok / error / timeout / cpu_limit / memory_limit / output_limit /
  file_size_limit / killed / sandbox_error), bounded stdout/stderr (non-UTF-8 bytes replaced), the
  isolation set up, and the scratch files asked for with ``collect=``.
* :class:`SandboxWorker` — a long-lived sandboxed process that loads an entry file once and serves
  JSON calls over pipes (``worker.call("fn", *args)``), for hooks called many times per episode.
* :func:`whale.sandbox.process.launch` — the primitive both use (the harness runtime adopts its pipes
  into asyncio). Contract: ``launch(mode="run"|"worker", target=NAME, args=[...], limits=Limits(...),
  isolation=Isolation(...), files={NAME: str|bytes}, env={...}|None, stdin=fd|subprocess.PIPE|None,
  sys_path=[host dirs], collect=[names])`` returns a :class:`~whale.sandbox.process.Launched` once the
  guard inside has checked it holds no privilege: ``proc`` (a ``Popen``; its stdin/stdout/stderr are
  the program's), ``isolation`` (the status dict), ``kill_tree()`` (kills every process of the sandbox
  and returns once they are gone), ``wait_exit(timeout_s)``, ``cleanup()`` (kill, close the pipes,
  free the uid). ``proc``'s exit status is the program's (code, or ``-signal``). ``target`` and the
  ``files`` live in the scratch directory, ``/scratch`` inside. It raises :class:`SandboxSetupError`
  (naming the step that failed) when any isolation step fails, and ``ValueError`` for bad names.

What the program sees (``Isolation(level="namespaces")``, the default): a fresh root (``pivot_root``
into a tmpfs, the host's root detached) holding only the system runtime (/usr and the /bin, /lib,
/lib64, /sbin links) and the interpreter's prefix read-only — its site-packages hidden —,
:attr:`Isolation.read_paths` and ``sys_path`` read-only at their own paths, the packages of
:attr:`Isolation.packages` read-only under ``/sandbox/site``, a minimal /dev (null, zero, full,
random, urandom), a synthesized /etc (passwd/group naming the sandbox user, nsswitch.conf,
ld.so.cache), a fresh /proc of its own PID namespace, and the scratch directory: an in-memory tmpfs
of ``Limits.scratch_bytes`` that is HOME, TMPDIR and cwd. No /tmp, /run, /home, /root (beyond the
interpreter's path), /work, data root or checkout. Its own PID (it is PID 2; PID 1 is a
non-dumpable init that kills everything when the program ends or the sandbox is killed), network (no
interface), IPC and UTS namespaces. It runs with no capability, no_new_privs and an empty bounding
set: as a root caller's child under a fresh uid per sandbox (≥ 200000, RLIMIT_NPROC per sandbox); as a
non-root caller's child in a user namespace (mapping the caller to root, for the setup only) inside
which a second user namespace gives the program an unprivileged uid with no power over its mounts.
rlimits (CPU, address space, file size, processes, open files, no core), a wall clock, output caps,
an allow-listed environment. The guard's audit hooks (network, reads outside the allow-list, writes
outside scratch) are defence in depth only.

``Isolation(host_network=True)`` keeps every wall but the network: the program
stays in the host's network namespace, and the host's DNS and CA files (/etc/resolv.conf, /etc/hosts,
/etc/ssl, ...) are mounted read-only so it can resolve and verify a remote API. It is asked for by
name, and one sandbox may: the ``cli`` proposer's agent at ``network: host``.

``Isolation(egress_socket=PATH)`` (the ``cli`` agent's default, ``network: proxy``) keeps the network wall and adds
one way out: the sandbox's loopback is brought up, a relay started by its init before the program listens on
127.0.0.1:3128 and carries each connection to the Unix socket ``PATH`` (bind-mounted at ``/sandbox/egress.sock``),
where :class:`whale.sandbox.egress.EgressProxy` opens only what its allow-list allows; the program gets
``HTTPS_PROXY`` and its kin, and the host's CA files read-only.

``Isolation(level="none")`` (``Isolation.none()``) is for trusted local use and must be asked for
by name: the same launcher without namespaces, mounts or uid change — the program reads and writes
what the caller can and has the network. Nothing ever falls back to it.
"""

from whale.sandbox.policy import (
    GiB,
    Isolation,
    IsolationLevel,
    Limits,
    MiB,
    Outcome,
    build_env,
    classify,
)
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
