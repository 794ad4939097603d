"""A ``cli`` proposer's agent on a cluster: started by the search Job's ``proposer-agent`` container, not by the search.

The search container holds what the search calls (the store credentials, the vLLM key, the harness host's caller
token, a judge's key) and is restricted; the agent container beside it holds only the agent's API key and the right
to build sandboxes (the sandbox-host security context), and the two share no PID namespace, so nothing the agent
runs can read the search's ``/proc/<pid>/environ``. They meet on one ``emptyDir``, mounted at the same path in both
(so the archive copy's path is the same on both sides), through files:

* ``<root>/ready`` — the runner (:func:`serve`), once it is up (its own check passed);
* ``<root>/requests/<id>.json`` — the search side (:class:`ExchangeLauncher`): one :class:`AgentJob`;
* ``<root>/running/<id>.json`` — the runner claims a request by renaming it there (one claimant);
* ``<root>/results/<id>.json`` — the runner: the :class:`~whale.sandbox.SandboxResult`, or ``{"error": ...}``.

One writer per file, every write atomic (a hidden temporary name in the same directory, then ``os.replace``), every
read size-capped. Both sides are bounded: the search side waits :data:`READY_WAIT_S` for ``ready`` and then the
session's timeout plus :data:`~whale.metaharness.proposer.cli_agent.CLI_GRACE_S` plus :data:`ANSWER_MARGIN_S` for
the result, and fails closed (:class:`ProposerUnavailable`: the phase fails naming the container) when nothing comes;
the runner's sandbox has its own wall clock. The runner refuses to serve while it can see a credential other than
the agent's key or a service-account token (the harness host's rule, :func:`whale.harness.host.credential_exposure`).

Entry point of the agent container: ``python -m whale.metaharness.proposer.agent_exchange --exchange DIR [--key-env
NAME] [--read-path P ...] [--network proxy|host|none] [--allow-host H ...] [--allow-private-host H ...]
[--allow-service URL ...] [--isolation namespaces]``. With ``--network proxy`` (the default) the runner serves each
session's egress proxy (:mod:`whale.sandbox.egress`) itself, for that session's length: the agent reaches the
``--allow-host`` names and the run's ``--allow-service`` tool services only (never services a request names).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from whale.core.egress import DEFAULT_ALLOW_HOSTS
from whale.metaharness import proposer
from whale.metaharness.proposer.base import ProposerError, ProposerUnavailable
from whale.metaharness.proposer.cli_agent import (
    CLI_GRACE_S,
    NETWORKS,
    AgentJob,
    AgentLauncher,
    AgentWalls,
    run_agent_sandbox,
)
from whale.sandbox import SandboxResult
from whale.sandbox.policy import Outcome

log = logging.getLogger(__name__)

#: the search container's variable naming the exchange directory (set by the operator; unset: the agent's sandbox is
#: started in-process, as ``whale run`` does)
AGENT_EXCHANGE_ENV = proposer.AGENT_EXCHANGE_ENV
#: the runner's module (``python -m``)
RUNNER_MODULE = "whale.metaharness.proposer.agent_exchange"
READY = "ready"
REQUESTS, RUNNING, RESULTS = "requests", "running", "results"
SUBDIRS = (REQUESTS, RUNNING, RESULTS)
#: how long the search side waits for the runner's ``ready`` (it starts before the search: a native sidecar)
READY_WAIT_S = 10.0
#: how long past the sandbox's own wall clock the search side waits for the result
ANSWER_MARGIN_S = 10.0
#: how often each side looks for the other's file
POLL_S = 0.2
#: the largest request and result read (a request holds the workspace; a result the collected files, 32 MiB, the
#: output tails and base64's third)
MAX_REQUEST_BYTES = 64 << 20
MAX_RESULT_BYTES = 64 << 20
#: variables of the search container the agent's must never hold besides cloud/S3 credentials
SEARCH_ONLY_ENV = ("WHALE_INFERENCE_API_KEY", "WHALE_HARNESS_TOKEN")


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path`` all at once: written under a hidden name beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read_capped(path: Path, limit: int) -> bytes:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ProposerError(f"{path.name} is larger than {limit} bytes")
    return data


def _shared_dir(path: Path) -> None:
    """A directory both containers write (the search as its non-root user, the runner as root)."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        path.chmod(0o777)
    except PermissionError:  # made by the other side, which set it already
        pass


def result_to_wire(result: SandboxResult) -> dict[str, Any]:
    return {
        "outcome": result.outcome.value,
        "returncode": result.returncode,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "errorType": result.error_type,
        "wallS": result.wall_s,
        "isolation": result.isolation,
        "stdoutTruncated": result.stdout_truncated,
        "stderrTruncated": result.stderr_truncated,
        "files": {name: base64.b64encode(data).decode("ascii") for name, data in result.files.items()},
        "filesNotCollected": dict(result.files_not_collected),
    }


def result_from_wire(wire: Mapping[str, Any]) -> SandboxResult:
    """The runner's result (a trusted container's, read with the caps above); a malformed one is a ProposerError."""
    try:
        return SandboxResult(
            outcome=Outcome(wire["outcome"]),
            returncode=wire["returncode"],
            stdout=str(wire["stdout"]),
            stderr=str(wire["stderr"]),
            error_type=wire["errorType"],
            wall_s=float(wire["wallS"]),
            isolation=dict(wire["isolation"]),
            stdout_truncated=bool(wire["stdoutTruncated"]),
            stderr_truncated=bool(wire["stderrTruncated"]),
            files={str(k): base64.b64decode(v) for k, v in dict(wire["files"]).items()},
            files_not_collected={str(k): str(v) for k, v in dict(wire["filesNotCollected"]).items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProposerError(f"the proposer-agent container's result is malformed: {exc!r}") from None


class ExchangeLauncher(AgentLauncher):
    """The search side: hands each :class:`AgentJob` to the ``proposer-agent`` container and waits for its result.

    Args:
        root: the exchange directory (``$WHALE_PROPOSER_AGENT_EXCHANGE``).
        ready_wait_s, answer_margin_s, grace_s: the bounds described in the module's docstring.
    """

    def __init__(
        self,
        root: Path,
        *,
        ready_wait_s: float = READY_WAIT_S,
        answer_margin_s: float = ANSWER_MARGIN_S,
        grace_s: float = CLI_GRACE_S,
    ):
        self.root = Path(root)
        self.ready_wait_s = ready_wait_s
        self.answer_margin_s = answer_margin_s
        self.grace_s = grace_s  # the sandbox's wall clock past the session's timeout (run_agent_sandbox's)
        self._wake = threading.Event()  # never set: a bounded wait between looks

    def _wait_for(self, path: Path, deadline: float) -> bool:
        while not path.exists():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._wake.wait(min(POLL_S, left))
        return True

    def run(self, job: AgentJob) -> SandboxResult:
        if not self._wait_for(self.root / READY, time.monotonic() + self.ready_wait_s):
            raise ProposerUnavailable(
                f"the proposer-agent container is not running: no {self.root / READY} after {self.ready_wait_s:.0f} s "
                "(a cli proposer's agent runs in the search Job's `proposer-agent` container on a cluster; "
                "see docs/metaharness.md, 'A cli agent on a cluster')"
            )
        requests = self.root / REQUESTS
        _shared_dir(requests)
        ident = uuid.uuid4().hex
        request = requests / f"{ident}.json"
        write_atomic(request, json.dumps(job.to_wire()).encode())
        budget = job.timeout_s + self.grace_s + self.answer_margin_s
        result = self.root / RESULTS / f"{ident}.json"
        if not self._wait_for(result, time.monotonic() + budget):
            try:
                request.unlink()  # not claimed yet: withdrawn (a claimed one ends at its sandbox's wall clock)
            except FileNotFoundError:
                pass
            raise ProposerUnavailable(
                f"the proposer-agent container did not answer request {ident} within {budget:.0f} s (the session's "
                f"{job.timeout_s:.0f} s, the sandbox's {self.grace_s:.0f} s grace and {self.answer_margin_s:.0f} s); "
                "its log says why (kubectl logs <search pod> -c proposer-agent)"
            )
        try:
            data = read_capped(result, MAX_RESULT_BYTES)
        finally:
            result.unlink(missing_ok=True)
        try:
            wire = json.loads(data)
        except ValueError:
            raise ProposerError("the proposer-agent container's result is not JSON") from None
        if not isinstance(wire, dict):
            raise ProposerError("the proposer-agent container's result is not a JSON object")
        if wire.get("error"):
            raise ProposerError(str(wire["error"])[:2000])
        return result_from_wire(wire)


# ----- the runner (the agent container) ------------------------------------------------------------------------


def exposure(environ: Mapping[str, str], key_env: str | None, token_path: Path | None = None) -> list[str]:
    """What the agent's container could lose to the agent if its sandbox failed, besides the agent's own key: one line
    per credential it can see (empty: none)."""
    from whale.harness.host import SERVICE_ACCOUNT_TOKEN, credential_exposure

    found = credential_exposure(environ, token_path or SERVICE_ACCOUNT_TOKEN, allowed_env=(key_env,) if key_env else ())
    found += [f"the search's variable ${n} in the environment" for n in SEARCH_ONLY_ENV if n in environ]
    return found


def handle(root: Path, request: Path, walls: AgentWalls, isolation: str) -> dict[str, Any]:
    """One claimed request: its job run in the agent's sandbox, as the result's JSON form."""
    try:
        job = AgentJob.from_wire(json.loads(read_capped(request, MAX_REQUEST_BYTES)))
        if job.isolation != isolation:
            raise ProposerError(
                f"this container runs agents at isolation {isolation}, the job asks for {job.isolation}"
            )
        archive = Path(job.archive_dir).resolve()
        if not archive.is_relative_to(root.resolve()):
            raise ProposerError(f"the archive copy {archive} is outside the exchange directory {root}")
        return result_to_wire(run_agent_sandbox(job, walls))
    except ProposerError as exc:
        return {"error": str(exc)}
    except ValueError as exc:  # not JSON
        return {"error": f"the request is malformed: {exc}"}


def _age(path: Path) -> float:
    """A request's modification time (oldest first); one withdrawn meanwhile sorts first and is skipped."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def serve(
    root: Path, walls: AgentWalls, *, isolation: str = "namespaces", stop: Callable[[], bool] = lambda: False
) -> None:
    """Answer requests one at a time until ``stop()`` (the kubelet ends the container when the search ends)."""
    for name in SUBDIRS:
        _shared_dir(root / name)
    write_atomic(root / READY, json.dumps({"pid": os.getpid()}).encode())
    idle = threading.Event()
    while not stop():
        waiting = sorted((root / REQUESTS).glob("[!.]*.json"), key=_age)
        if not waiting:
            idle.wait(POLL_S)
            continue
        claimed = root / RUNNING / waiting[0].name
        try:
            os.rename(waiting[0], claimed)
        except FileNotFoundError:  # withdrawn by the search side meanwhile
            continue
        log.info("agent session %s", claimed.stem)
        try:
            answer = handle(root, claimed, walls, isolation)
        except Exception as exc:  # a runner bug answers this request (the search fails it), the next is still served
            log.exception("agent session %s failed", claimed.stem)
            answer = {"error": f"the proposer-agent container failed: {type(exc).__name__}: {exc}"}
        write_atomic(root / RESULTS / claimed.name, json.dumps(answer).encode())
        claimed.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {RUNNER_MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--exchange", required=True, type=Path, help="the directory shared with the search container")
    parser.add_argument("--key-env", help="the variable holding the agent's API key (apiKeySecret.env), if it has one")
    parser.add_argument("--read-path", action="append", default=[], help="the agent's install, read-only (readPaths)")
    parser.add_argument("--network", choices=NETWORKS, default="proxy")
    parser.add_argument(
        "--allow-host", action="append", default=None, help="with --network proxy: a name (or name:port) to reach"
    )
    parser.add_argument(
        "--allow-service",
        action="append",
        default=[],
        help="with --network proxy: a tool service of the run (http://host:port) the prototyping kit lists",
    )
    parser.add_argument(
        "--allow-private-host",
        action="append",
        default=[],
        help="with --network proxy: an --allow-host name that may resolve to a private address",
    )
    parser.add_argument("--isolation", choices=("namespaces",), default="namespaces")
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    seen = exposure(environ, args.key_env)
    if seen:
        print(
            "the proposer-agent container refuses to run an agent where it can see credentials besides the agent's "
            "key: " + "; ".join(seen),
            file=sys.stderr,
        )
        return 2
    key = environ.get(args.key_env) if args.key_env else None
    if args.key_env and not key:
        print(f"the proposer-agent container has no ${args.key_env} (the agent's API key)", file=sys.stderr)
        return 2
    try:
        walls = AgentWalls(
            read_paths=tuple(args.read_path),
            network=args.network,
            env={args.key_env: key} if key else {},
            allow_hosts=tuple(args.allow_host or DEFAULT_ALLOW_HOSTS),
            allow_private_hosts=tuple(args.allow_private_host),
            services=tuple(args.allow_service),
        )
    except ProposerError as exc:
        print(f"the proposer-agent container: {exc}", file=sys.stderr)
        return 2
    serve(args.exchange, walls, isolation=args.isolation)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
