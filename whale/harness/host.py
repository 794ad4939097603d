"""The run's harness host: the one server of the harness pod, where untrusted harness files run.

``python -m whale.harness.host --port 7070 --isolation pod`` (the operator's harness Deployment runs it;
the caller token comes from ``$WHALE_HARNESS_TOKEN``, the run's Secret). Per connection from one of the
run's workload pods it checks the token, starts one harness worker process through the same launcher
as a local run (:func:`whale.harness.launch.spawn_local`: rlimits, a fresh scratch directory, the
allow-listed environment, the confined imports; kernel namespaces too at level ``namespaces``), and
relays its stdio over the connection (:mod:`whale.harness.remote` has the wire protocol). Closing the
connection kills the process group. A ``shell`` request runs one of the proposer's ``run_shell`` commands
(:mod:`whale.harness.shell`) over the archive snapshot it carries, in a fresh directory, and answers with its
output: so at level ``pod`` the harness-search pod starts no sandbox itself.

Bounded everywhere: at most ``max_connections`` processes at once (one more is refused), the caller's
first line and every stdin line at most ``max_message_bytes``, a connection idle (no request in flight,
nothing sent) for ``idle_timeout_s`` is closed, and a request unanswered for the call deadline (the
caller's hook/start timeout, clamped to the host's, plus a grace) kills the process — the caller's own
per-call clock kills and restarts it first. The caller's limits are clamped to the host's maxima.

Fail closed: :func:`credential_exposure` lists every credential this process can see (a service-account
token, cloud or S3 keys in its environment); :func:`main` refuses to serve while it finds any, so a harness
pod rendered with credentials never runs a harness file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from whale.harness import launch, remote, shell

log = logging.getLogger(__name__)

#: where Kubernetes mounts a pod's service-account token (automountServiceAccountToken)
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
#: environment names that hold credentials: cloud SDKs' (AWS_*, AZURE_*, GOOGLE_APPLICATION_CREDENTIALS) and any
#: S3/MinIO key, secret, token or password
CREDENTIAL_ENV_RE = re.compile(
    r"^(AWS_|AZURE_|GOOGLE_APPLICATION_CREDENTIALS$)|(S3|MINIO).*(KEY|SECRET|TOKEN|PASSWORD)", re.IGNORECASE
)
#: why a connection ended when the host closed it for idleness (the caller then starts a new process when it needs
#: one, without counting a restart: nothing failed)
IDLE = "idle"
#: extra seconds the host waits past the caller's deadline before it kills a process itself
DEADLINE_GRACE_S = 5.0
#: callers in their first line beyond max_connections (a TCP probe, a caller whose process is being replaced)
HANDSHAKE_SLACK = 16
#: the most a caller may take to send its first line
HELLO_TIMEOUT_S = 30.0
#: pipe reads are relayed in chunks of at most this size
CHUNK_BYTES = 64 << 10


def credential_exposure(
    environ: Mapping[str, str], token_path: Path = SERVICE_ACCOUNT_TOKEN, allowed_env: Sequence[str] = ()
) -> list[str]:
    """What this process could hand a harness if its wall failed: one line per credential it can see (empty:
    none). ``allowed_env``: names that are expected here (the host's own caller token)."""
    found = []
    if token_path.exists():
        found.append(f"a service-account token at {token_path} (set automountServiceAccountToken: false)")
    for name in sorted(environ):
        if name not in allowed_env and CREDENTIAL_ENV_RE.search(name):
            found.append(f"credential variable ${name} in the environment")
    return found


@dataclasses.dataclass(frozen=True)
class HostConfig:
    """The harness host's own bounds (the callers' limits are clamped to :attr:`limits`)."""

    token: str = dataclasses.field(repr=False)
    #: ``spec.execution.sandbox.isolation`` of the run: "pod" (the pod is the wall) or "namespaces" (inside it too)
    isolation: launch.IsolationLevel = "pod"
    #: harness processes at once (each connection is one)
    max_connections: int = 64
    #: the caller's first line (the harness file) and each request line (a hook's arguments carry the episode's
    #: state, which the harness may grow up to its answer limit, 8 MiB by default)
    max_message_bytes: int = 16 << 20
    #: a connection with nothing in flight and no traffic for this long is closed
    idle_timeout_s: float = 3600.0
    #: the most any caller may ask for (memory, CPU seconds, timeouts, ...)
    limits: launch.SandboxLimits = launch.SandboxLimits()
    #: the longest wall clock of one run_shell command
    shell_timeout_s: float = shell.SHELL_MAX_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.isolation not in ("pod", "namespaces"):
            raise ValueError(f"the harness host runs at isolation pod or namespaces, got {self.isolation!r}")
        if not self.token:
            raise ValueError(f"the harness host needs the run's caller token (${launch.HARNESS_TOKEN_ENV})")

    def clamp(self, asked: Any) -> launch.SandboxLimits:
        """The caller's limits (untrusted JSON), each at most the host's, at the host's isolation."""
        values: dict[str, Any] = {}
        for name in remote.LIMIT_FIELDS:
            cap = getattr(self.limits, name)
            value = asked.get(name) if isinstance(asked, dict) else None
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            values[name] = type(cap)(min(value, cap)) if ok else cap
        return dataclasses.replace(self.limits, **values, isolation=self.isolation, host=None)


class _Refused(Exception):
    """A caller the host does not serve (the message goes back to it)."""


class HarnessHost:
    """``await HarnessHost(config).serve(host, port)``."""

    def __init__(self, config: HostConfig):
        self.config = config
        #: connections still in their first line (not yet authenticated), and live harness processes
        self.handshakes = 0
        self.processes = 0

    async def serve(self, address: str, port: int, ready: asyncio.Future[int] | None = None) -> None:
        server = await asyncio.start_server(self._handle, address, port, limit=self.config.max_message_bytes)
        bound = server.sockets[0].getsockname()[1]
        log.info("harness host on %s:%d (isolation %s)", address, bound, self.config.isolation)
        if ready is not None:
            ready.set_result(bound)
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_one(reader, writer)
        except _Refused as exc:
            log.warning("refused a caller: %s", exc)
            with contextlib.suppress(OSError, ConnectionError):
                await _send(writer, remote.STATUS, json.dumps({"ok": False, "error": str(exc)}).encode())
        except (OSError, ConnectionError):
            pass  # the caller went away
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cfg = self.config
        if self.handshakes >= cfg.max_connections + HANDSHAKE_SLACK:
            raise _Refused(f"the harness host has {self.handshakes} callers still sending their first line")
        self.handshakes += 1
        try:
            line = await asyncio.wait_for(reader.readline(), min(cfg.limits.start_timeout_s, HELLO_TIMEOUT_S))
            if not line:
                return  # connected and closed: a TCP probe (the pod's readiness and liveness)
            request = json.loads(line)
        except (TimeoutError, ValueError, asyncio.LimitOverrunError) as exc:
            raise _Refused(f"the first line must be one JSON object within the limits ({type(exc).__name__})") from None
        finally:
            self.handshakes -= 1
        if not isinstance(request, dict) or not isinstance(request.get("token"), str):
            raise _Refused("the first line must be a JSON object with a token")
        if not hmac.compare_digest(request["token"].encode(), cfg.token.encode()):
            raise _Refused("wrong token")
        if request.get("kind") == remote.SHELL:
            await self._serve_shell(request, reader, writer)
            return
        source, allowed = request.get("harness"), request.get("allowed")
        if not isinstance(source, str) or not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
            raise _Refused("harness must be the file's text and allowed a list of module names")
        limits = cfg.clamp(request.get("limits"))
        if self.processes >= cfg.max_connections:
            raise _Refused(f"the harness host is busy ({cfg.max_connections} processes)")
        self.processes += 1
        workdir = Path(tempfile.mkdtemp(prefix="whale-harness-conn-"))
        try:
            path = workdir / "harness.py"
            path.write_text(source, encoding="utf-8")
            try:
                spawned = await launch.spawn_local(path, frozenset(allowed), limits, in_harness_pod=True)
            except launch.IsolationUnavailableError as exc:
                raise _Refused(str(exc)) from None
            except (OSError, ValueError, RuntimeError) as exc:
                raise _Refused(f"the sandbox did not start: {exc}") from None
            errors = asyncio.create_task(_drain(spawned.stderr, writer))
            try:
                await _send(writer, remote.STATUS, json.dumps({"ok": True, "isolation": spawned.isolation}).encode())
                ended = await self._relay(spawned, reader, writer, limits)
            finally:
                await spawned.kill()
                with contextlib.suppress(TimeoutError, OSError, ConnectionError):
                    await asyncio.wait_for(errors, 1.0)  # the stderr tail of a process that ended, for the caller
                errors.cancel()
                await asyncio.gather(errors, return_exceptions=True)
            code = spawned.returncode
            with contextlib.suppress(OSError, ConnectionError):
                await _send(writer, remote.EXIT, json.dumps({"returncode": code, "idle": ended == IDLE}).encode())
        finally:
            self.processes -= 1
            shutil.rmtree(workdir, ignore_errors=True)

    async def _serve_shell(
        self, request: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One ``run_shell`` command (:mod:`whale.harness.shell`): read the snapshot, extract it into a fresh
        directory, run the command there (without kernel namespaces at ``pod``, with them at ``namespaces``),
        answer with its output, remove the directory."""
        cfg = self.config
        try:
            command = shell.check_command(request.get("command"))
        except ValueError as exc:
            raise _Refused(str(exc)) from None
        size = request.get("snapshot_bytes")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= shell.MAX_SNAPSHOT_BYTES:
            raise _Refused(f"snapshot_bytes must be an integer from 0 to {shell.MAX_SNAPSHOT_BYTES}")
        wall_s = shell.wall_clock(request.get("timeout_s"), cfg.shell_timeout_s)
        if self.processes >= cfg.max_connections:
            raise _Refused(f"the harness host is busy ({cfg.max_connections} processes)")
        self.processes += 1
        workdir = Path(tempfile.mkdtemp(prefix="whale-shell-conn-"))
        try:
            try:
                data = await asyncio.wait_for(reader.readexactly(size), HELLO_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError) as exc:
                raise _Refused(f"the snapshot did not arrive ({type(exc).__name__})") from None
            try:
                archive, candidates = await asyncio.to_thread(shell.unpack, data, workdir)
            except shell.SnapshotError as exc:
                raise _Refused(str(exc)) from None
            level = "pod-host" if cfg.isolation == "pod" else "namespaces"
            try:
                output = await asyncio.to_thread(shell.run_command, command, archive, candidates, wall_s, level=level)
            except (OSError, ValueError, RuntimeError) as exc:  # SandboxSetupError is a RuntimeError
                raise _Refused(f"the sandboxed shell cannot start on the harness host: {exc}") from None
            await _send(writer, remote.STATUS, json.dumps({"ok": True, "output": output}).encode())
        finally:
            self.processes -= 1
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _relay(
        self,
        spawned: launch.Spawned,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        limits: launch.SandboxLimits,
    ) -> str:
        """Pipe the caller's bytes to the process's stdin and its stdout back as frames until either side ends or
        a bound is hit; returns why it ended (:data:`IDLE` for an idle connection)."""
        cfg = self.config
        clock = {"owed": 1, "since": time.monotonic(), "active": time.monotonic()}  # the ready line is owed first

        async def to_process() -> str:
            line_bytes = 0
            while chunk := await reader.read(CHUNK_BYTES):
                newline = chunk.rfind(b"\n")
                line_bytes = len(chunk) - newline - 1 if newline >= 0 else line_bytes + len(chunk)
                if line_bytes > cfg.max_message_bytes:
                    return f"a request line passed {cfg.max_message_bytes} bytes"
                if clock["owed"] == 0:
                    clock["since"] = time.monotonic()
                clock["owed"] += chunk.count(b"\n")
                clock["active"] = time.monotonic()
                spawned.stdin.write(chunk)
                await spawned.stdin.drain()
            return "the caller closed the connection"

        async def from_process() -> str:
            while chunk := await spawned.stdout.read(CHUNK_BYTES):
                clock["owed"] = max(0, clock["owed"] - chunk.count(b"\n"))
                clock["since"] = clock["active"] = time.monotonic()
                await _send(writer, remote.STDOUT, chunk)
            return "the process ended"

        async def watchdog() -> str:
            deadline_s = max(limits.hook_timeout_s, limits.start_timeout_s) + DEADLINE_GRACE_S
            while True:
                now = time.monotonic()
                if clock["owed"] and now - clock["since"] > deadline_s:
                    return f"a request went unanswered for {deadline_s:g} s"
                if not clock["owed"] and now - clock["active"] > cfg.idle_timeout_s:
                    return IDLE
                await asyncio.sleep(min(1.0, deadline_s / 4))

        tasks = {
            asyncio.create_task(to_process()),
            asyncio.create_task(from_process()),
            asyncio.create_task(watchdog()),
        }
        reason = "the connection broke"
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                with contextlib.suppress(OSError, ConnectionError, asyncio.CancelledError):
                    reason = task.result()
            log.info("harness connection ends: %s", reason if reason != IDLE else f"idle for {cfg.idle_timeout_s:g} s")
            return reason
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _send(writer: asyncio.StreamWriter, channel: bytes, payload: bytes) -> None:
    for start in range(0, max(len(payload), 1), remote.MAX_FRAME_BYTES):
        writer.write(remote.frame(channel, payload[start : start + remote.MAX_FRAME_BYTES]))
    await writer.drain()


async def _drain(stderr: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The process's stderr to the caller (its tail names why a harness failed to load)."""
    while chunk := await stderr.read(CHUNK_BYTES):
        await _send(writer, remote.STDERR, chunk)


def _not_dumpable() -> None:
    """Make this process's /proc files (its environ, with the caller token) unreadable to its children, which
    run as the same user at level ``pod`` (prctl PR_SET_DUMPABLE 0; Linux only, best effort elsewhere)."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m whale.harness.host", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=7070)
    parser.add_argument("--isolation", choices=("pod", "namespaces"), default="pod")
    parser.add_argument("--max-connections", type=int, default=64)
    parser.add_argument("--idle-timeout-s", type=float, default=3600.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    exposed = credential_exposure(os.environ, allowed_env=(launch.HARNESS_TOKEN_ENV,))
    if exposed:
        print(
            "harness host refuses to serve: it can see credentials a harness file could take: "
            + "; ".join(exposed)
            + ". The harness pod must hold no credentials (docs/security.md)",
            file=sys.stderr,
        )
        return 2
    try:
        config = HostConfig(
            token=os.environ.get(launch.HARNESS_TOKEN_ENV, ""),
            isolation=args.isolation,
            max_connections=args.max_connections,
            idle_timeout_s=args.idle_timeout_s,
        )
    except ValueError as exc:
        print(f"harness host: {exc}", file=sys.stderr)
        return 2
    _not_dumpable()
    asyncio.run(HarnessHost(config).serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
