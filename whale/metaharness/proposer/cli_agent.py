"""External agent CLI proposer (backend ``cli``): a coding-agent command run inside the sandbox.

``spec.experiment.harnessSearch.proposer.command`` is an argv template; these fields are filled in:
``{scratch}`` (the agent's workspace and working directory; candidates go to
``{scratch}/candidates/NAME.py`` with an optional ``NAME.md`` rationale), ``{archive}`` (the read-only
copy of the archive), ``{skill}`` (the domain's SKILL.md), ``{prompt}`` (PROMPT.md: the task statement,
also fed on stdin), ``{n}`` (how many candidates), ``{iteration}``, ``{max_turns}`` and ``{timeout}``
(the proposer's budgets, for agents that take them as flags), ``{model}`` and ``{effort}`` (the spec's
``model`` and ``effort``) and ``{skill_text}`` (the skill's text under the reference's "Follow these skill
instructions" header, for ``--append-system-prompt``). A Claude Code style agent (the examples run the
paper's command; docs/metaharness.md has the manifest)::

    command: ["claude", "-p", "--output-format", "json", "--max-turns", "{max_turns}",
              "--permission-mode", "bypassPermissions", "--add-dir", "{archive}",
              "Read {prompt} and {skill}, then do what they say: write {n} candidates into {scratch}/candidates/."]

The agent is untrusted (issue #12's threat model), so it runs in a ``whale.sandbox`` run
(:data:`spec.execution.sandbox.isolation`), never as a plain subprocess:

* **filesystem** (allow-list): its workspace — the sandbox's bounded in-memory scratch (HOME, TMPDIR,
  cwd) holding PROMPT.md, SKILL.md, ``candidates/`` and the prototyping kit ``proto/`` (the harness API, the
  D_harness tasks without gold, clients of the run's tool services; :mod:`whale.metaharness.proposer.kit`) —
  read-write; the archive copy read-only; the
  agent's own install read-only (``spec.experiment.harnessSearch.proposer.readPaths``, besides the system runtime
  under /usr that every sandbox has); nothing else: no data root (no test split), no checkout, no
  /proc of the host, no /tmp, no home;
* **environment**: only the sandbox's fixed variables plus the API key, under the name
  ``apiKeySecret.env`` — nothing of the parent's environment;
* **network** (``spec.experiment.harnessSearch.proposer.network``): the agent must reach its model's API, and nothing
  else. ``proxy`` (the default): its own network namespace with loopback only, and one way out, the egress proxy
  (:mod:`whale.sandbox.egress`, started here by the launcher for the session's length) that opens only
  ``CONNECT host:port`` to the names ``allowHosts`` lists (public addresses only, unless ``allowPrivateHosts`` names
  the host) and to the run's tool services the prototyping kit lists (the trusted side's: :attr:`AgentJob.services`
  in-process, the agent container's ``--allow-service`` on a cluster); ``host`` shares the host's network namespace (``Isolation(host_network=True)``: everything the
  launcher reaches — the run's vLLM, the tool services, the store, cloud metadata — as the paper's reference ran
  Claude Code); ``none`` gives it none (an agent that talks to a model some other way, or a test);
* **limits**: ``timeout`` for the whole session, enforced twice — the driver inside kills every process
  of the sandbox at the deadline and hands back what was written, and the sandbox's own wall clock
  (``CLI_GRACE_S`` later) kills everything regardless; per-process memory, CPU, file-size and process
  limits; the output's tail only.

**Who starts the sandbox** (:class:`AgentLauncher`, one interface, two ways): in ``whale run`` the search process
itself (:class:`InProcessLauncher`); on a cluster the search Job's ``proposer-agent`` container
(:class:`~whale.metaharness.proposer.agent_exchange.ExchangeLauncher`), which alone holds the agent's API key and
the right to build sandboxes, and none of the search's keys: the search hands it the sandbox's inputs
(:class:`AgentJob`) through a shared directory and reads back the :class:`~whale.sandbox.SandboxResult`
(docs/security.md, "No credentials near untrusted code"). Both run :func:`run_agent_sandbox`.

A small driver (``_DRIVER``, run as the sandbox's program) starts the agent, keeps the tail of its
output, kills what is left when it ends, and bundles ``candidates/*.py|*.md`` (regular files, capped)
into one file the sandbox hands back. Whatever comes back is untrusted: files are collected with size
caps and the search loop validates each one. Every failure (non-zero exit, timeout, a sandbox that
cannot start) is a note, and the iteration goes on. When the agent prints a Claude Code style JSON
result (``--output-format json``), its ``usage`` and ``num_turns`` are recorded with the paper's count:
generated plus newly read tokens (``input_tokens + cache_creation_input_tokens + output_tokens``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.core.egress import DEFAULT_ALLOW_HOSTS, EgressPolicy
from whale.metaharness.proposer.base import (
    CANDIDATES_DIR,
    MAX_CANDIDATE_BYTES,
    MAX_RATIONALE_BYTES,
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerReport,
    ProposerUnavailable,
    collect_candidates,
    task_prompt,
)
from whale.metaharness.proposer.kit import CLI_OFFLINE_README, kit_services, offline_kit

if TYPE_CHECKING:
    from whale.sandbox import SandboxResult

OUTPUT_TAIL_BYTES = 64_000
FIELDS = (
    "scratch",
    "archive",
    "skill",
    "prompt",
    "n",
    "iteration",
    "max_turns",
    "timeout",
    "model",
    "effort",
    "skill_text",
)
#: how the reference hands Claude Code the domain's skill: appended to its system prompt under this header
SKILL_PREFIX = "Follow these skill instructions:\n\n## Skill: harness-search\n"
#: how long after its deadline the sandbox's own wall clock kills everything (the driver's hand-back)
CLI_GRACE_S = 30.0
#: the agent's sandbox: address space per process (a Node.js agent reserves a lot), processes and
#: threads, open files, largest file, the in-memory workspace, what comes back
CLI_MEMORY_BYTES = 8 << 30
CLI_PROCESSES = 512
CLI_OPEN_FILES = 4096
CLI_FILE_SIZE_BYTES = 256 << 20
CLI_SCRATCH_BYTES = 512 << 20
CLI_COLLECT_BYTES = 32 << 20
#: the longest agent session a job may ask for (``spec.experiment.harnessSearch.proposer.timeoutSeconds``' bound)
MAX_SESSION_S = 7 * 86_400
#: ``spec.experiment.harnessSearch.proposer.network``: through the egress proxy, the host's, or none
NETWORKS = ("proxy", "host", "none")
#: the egress proxy's last decisions kept in the session's transcript
EGRESS_DECISIONS_KEPT = 50
#: files of candidates/ handed back at most
MAX_BUNDLED_FILES = 64
#: stands for the workspace's path in the rendered argv until the driver knows it (its cwd)
_SCRATCH_MARK = "@@WHALE_SCRATCH@@"
_CONFIG = "whale-agent.json"
#: the candidate files taken back: a plain name (no path, no hidden file), .py or .md
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}\.(py|md)")
_RESULT = "whale-result.json"

#: the sandbox's program: run the agent, keep its output's tail, end everything, bundle candidates/
_DRIVER = r"""
import json, os, select, signal, subprocess, time
cfg = json.load(open("whale-agent.json"))
here = os.getcwd()
argv = [a.replace(cfg["mark"], here) for a in cfg["argv"]]
os.makedirs("candidates", exist_ok=True)
deadline = time.monotonic() + cfg["timeout_s"]
tail, keep = bytearray(), cfg["tail_bytes"]
timed_out, returncode, error = False, None, None


def end_all(pid):
    # every other process of the sandbox (its own PID namespace); without one, the agent's group only
    try:
        if cfg["sandboxed"]:
            os.kill(-1, signal.SIGKILL)
        elif pid:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


proc = None
try:
    with open("PROMPT.md", "rb") as prompt:
        proc = subprocess.Popen(argv, cwd=here, stdin=prompt, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=not cfg["sandboxed"])
    fd = proc.stdout.fileno()
    exited = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = proc.poll() is None
            break
        if exited is None and proc.poll() is not None:
            exited = time.monotonic()
        if exited is not None and time.monotonic() - exited > 2:
            break  # the agent is done; something it left behind still holds the pipe
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            tail += chunk
            del tail[:-keep]
    if timed_out:
        end_all(proc.pid)
    try:
        returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0) + 5)
    except subprocess.TimeoutExpired:
        timed_out = True
        end_all(proc.pid)
        returncode = proc.wait()
except OSError as exc:
    error = f"cannot start the agent command {argv[0]!r}: {exc}"
end_all(proc.pid if proc else None)  # nothing the agent started may change candidates/ from here on
files, skipped = {}, []
for entry in sorted(os.scandir("candidates"), key=lambda e: e.name):
    if not (entry.name.endswith(".py") or entry.name.endswith(".md")):
        continue
    if not entry.is_file(follow_symlinks=False):
        skipped.append(f"{entry.name}: not a regular file")
        continue
    if len(files) >= cfg["max_files"]:
        skipped.append(f"{entry.name}: more than {cfg['max_files']} files")
        continue
    size = entry.stat(follow_symlinks=False).st_size
    if size > cfg["max_file_bytes"]:
        skipped.append(f"{entry.name}: {size} bytes > {cfg['max_file_bytes']}")
        continue
    with open(entry.path, "rb") as f:
        files[entry.name] = f.read(cfg["max_file_bytes"]).decode("utf-8", "replace")
with open("whale-result.json", "w") as out:
    json.dump({"files": files, "skipped": skipped, "returncode": returncode, "timed_out": timed_out,
               "error": error, "output_tail": bytes(tail).decode("utf-8", "replace")}, out)
"""


@dataclasses.dataclass(frozen=True)
class AgentJob:
    """One agent session's sandbox inputs, as the search side prepares them (it holds no key: the launcher adds the
    agent's environment)."""

    #: the workspace's files (PROMPT.md, SKILL.md, the prototyping kit, the driver's configuration)
    files: Mapping[str, str]
    #: the read-only archive copy (mounted at the same path inside the sandbox)
    archive_dir: str
    #: the session's budget; the sandbox's wall clock is this plus :data:`CLI_GRACE_S`
    timeout_s: float
    #: ``spec.execution.sandbox.isolation`` (``namespaces``, or ``none`` for trusted local use)
    isolation: str = "namespaces"
    #: the run's tool services the prototyping kit lists (their URLs): what the in-process launcher lets the agent
    #: reach besides its allow-list (the search process is the trusted side there; a cluster's agent container takes
    #: its own from its command line instead)
    services: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "files": dict(self.files),
            "archiveDir": self.archive_dir,
            "timeoutS": self.timeout_s,
            "isolation": self.isolation,
            "services": list(self.services),
        }

    @classmethod
    def from_wire(cls, wire: Any) -> AgentJob:
        """The job from its JSON form; a malformed one is a :class:`ProposerError` naming the field."""
        if not isinstance(wire, dict):
            raise ProposerError("an agent job must be a JSON object")
        files, archive, timeout, isolation = (wire.get(k) for k in ("files", "archiveDir", "timeoutS", "isolation"))
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ProposerError("an agent job's files must map names to texts")
        if not isinstance(archive, str) or not archive:
            raise ProposerError("an agent job needs archiveDir")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_SESSION_S:
            raise ProposerError(f"an agent job's timeoutS must be in (0, {MAX_SESSION_S}], got {timeout!r}")
        if isolation not in ("namespaces", "none"):
            raise ProposerError(f"an agent job's isolation must be namespaces or none, got {isolation!r}")
        services = wire.get("services", [])
        if not isinstance(services, list) or not all(isinstance(u, str) for u in services):
            raise ProposerError("an agent job's services must be a list of URLs")
        return cls(
            files=files, archive_dir=archive, timeout_s=float(timeout), isolation=isolation, services=tuple(services)
        )


@dataclasses.dataclass(frozen=True)
class AgentWalls:
    """What the agent's sandbox may see besides its workspace and the archive copy, and its environment: the
    trusted side's settings (the spec's on ``whale run``, the operator-rendered command line in the agent's
    container), never the job's."""

    #: the agent's own install, read-only (``readPaths``)
    read_paths: tuple[str, ...] = ()
    #: ``proxy`` (only ``allow_hosts``, through the egress proxy), ``host`` or ``none``
    network: str = "proxy"
    #: the only variables the agent gets besides the sandbox's fixed ones: its API key (and ``IS_SANDBOX``)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    #: with ``proxy``: the names (``host`` or ``host:port``) the agent may reach, and those of them that may resolve
    #: to a non-public address
    allow_hosts: tuple[str, ...] = DEFAULT_ALLOW_HOSTS
    allow_private_hosts: tuple[str, ...] = ()
    #: with ``proxy``: the run's tool services the prototyping kit lists (``http://host:port``), reachable as they are
    services: tuple[str, ...] = ()
    #: the allow-list as the proxy reads it (made from the three above)
    policy: EgressPolicy = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ProposerError(f"proposer network must be one of {', '.join(NETWORKS)}, got {self.network!r}")
        try:
            policy = EgressPolicy(tuple(self.allow_hosts), tuple(self.allow_private_hosts), tuple(self.services))
        except ValueError as exc:
            raise ProposerError(f"proposer allowHosts/allowPrivateHosts: {exc}") from None
        object.__setattr__(self, "policy", policy)


def agent_limits(timeout_s: float) -> Any:
    """The agent sandbox's limits for a session of ``timeout_s`` (the same wherever it is started)."""
    from whale.sandbox import Limits

    return Limits(
        wall_s=float(timeout_s) + CLI_GRACE_S,
        cpu_s=int(timeout_s) + int(CLI_GRACE_S),
        memory_bytes=CLI_MEMORY_BYTES,
        file_size_bytes=CLI_FILE_SIZE_BYTES,
        processes=CLI_PROCESSES,
        open_files=CLI_OPEN_FILES,
        stdout_bytes=OUTPUT_TAIL_BYTES,
        stderr_bytes=OUTPUT_TAIL_BYTES,
        scratch_bytes=CLI_SCRATCH_BYTES,
        collect_bytes=CLI_COLLECT_BYTES,
    )


def run_agent_sandbox(job: AgentJob, walls: AgentWalls) -> SandboxResult:
    """Run the driver (and so the agent) in its sandbox: the archive copy and ``walls.read_paths`` read-only, the
    network ``walls.network`` asks for, ``walls.env`` as its only environment. A sandbox that cannot start is a
    :class:`ProposerError` (nothing runs unwalled)."""
    from whale.sandbox import Isolation, SandboxSetupError, run_python
    from whale.sandbox.egress import EgressProxy, EgressProxyError

    if job.isolation == "none" and walls.network == "proxy":
        raise ProposerError(
            "proposer network: proxy needs spec.execution.sandbox.isolation: namespaces (the agent's own network "
            "namespace is the wall the proxy guards); with isolation none the agent has the host's network: set "
            "spec.experiment.harnessSearch.proposer.network: host to say so"
        )
    proxy: EgressProxy | None = None
    with contextlib.ExitStack() as stack:
        if job.isolation == "none":
            isolation = Isolation.none()
        else:
            if walls.network == "proxy":
                try:
                    proxy = stack.enter_context(EgressProxy(walls.policy))
                except EgressProxyError as exc:
                    raise ProposerError(f"the cli agent's sandbox cannot start: {exc}") from None
            isolation = Isolation(
                read_paths=(str(Path(job.archive_dir).resolve()), *walls.read_paths),
                host_network=walls.network == "host",
                egress_socket=proxy.socket_path if proxy else None,
            )
        try:
            result = run_python(
                _DRIVER,
                files=dict(job.files),
                env={"IS_SANDBOX": "1", **dict(walls.env)},
                limits=agent_limits(job.timeout_s),
                isolation=isolation,
                collect=[_RESULT],
            )
        except SandboxSetupError as exc:
            raise ProposerError(f"the cli agent's sandbox cannot start: {exc}") from None
        except ValueError as exc:  # a bad read path named in the spec
            raise ProposerError(f"the cli agent's sandbox: {exc}") from None
        if proxy is not None:  # what the agent asked for and what it got, for the session's transcript
            decisions = list(proxy.decisions)[-EGRESS_DECISIONS_KEPT:]
            result = dataclasses.replace(result, isolation={**result.isolation, "egress": decisions})
        return result


class AgentLauncher(abc.ABC):
    """Starts one agent session's sandbox and returns how it ended (blocking; called from a worker thread)."""

    @abc.abstractmethod
    def run(self, job: AgentJob) -> SandboxResult: ...


class InProcessLauncher(AgentLauncher):
    """The search process starts the sandbox itself (``whale run``): the agent's key is in this process."""

    def __init__(self, walls: AgentWalls):
        self.walls = walls

    def run(self, job: AgentJob) -> SandboxResult:
        # the search process made the job: the services its kit lists are the trusted side's too
        return run_agent_sandbox(job, dataclasses.replace(self.walls, services=tuple(job.services)))


def render_command(template: list[str], values: Mapping[str, str]) -> list[str]:
    """Fill ``{field}``s of the argv template; an unknown field is a configuration error."""
    out = []
    for arg in template:
        try:
            out.append(arg.format_map(dict(values)))
        except KeyError as exc:
            raise ProposerError(
                f"proposer command argument {arg!r} uses unknown field {exc}; known: {', '.join('{' + f + '}' for f in FIELDS)}"
            ) from None
        except (ValueError, IndexError) as exc:
            raise ProposerError(f"proposer command argument {arg!r} is not a valid template: {exc}") from None
    return out


class CLIAgentProposer(Proposer):
    """Backend ``cli``: the agent command, sandboxed.

    Args:
        command: the argv template (``spec.experiment.harnessSearch.proposer.command``).
        extra_env: the only variables the agent gets besides the sandbox's fixed ones (its API key).
        read_paths: the agent's own install, mounted read-only (``readPaths``).
        network: ``proxy`` (the default: only ``allow_hosts``, through the egress proxy), ``host`` or ``none``.
        allow_hosts, allow_private_hosts: the egress proxy's allow-list (``allowHosts``, ``allowPrivateHosts``); the
            run's tool services that the prototyping kit lists are reachable too.
        launcher: who starts the agent's sandbox; default :class:`InProcessLauncher` with these settings (on a
            cluster, :class:`~whale.metaharness.proposer.agent_exchange.ExchangeLauncher`: the key and the walls are
            the agent container's, so ``extra_env``, ``read_paths`` and the allow-lists are not used here; ``network``
            still says whether the prototyping kit offers the run's tool services).
    """

    backend = "cli"

    def __init__(
        self,
        command: list[str],
        extra_env: Mapping[str, str] | None = None,
        *,
        read_paths: Sequence[str] = (),
        network: str = "proxy",
        allow_hosts: Sequence[str] = DEFAULT_ALLOW_HOSTS,
        allow_private_hosts: Sequence[str] = (),
        model: str | None = None,
        effort: str | None = None,
        launcher: AgentLauncher | None = None,
    ):
        if not command:
            raise ProposerError("proposer backend 'cli' needs `command` (the agent CLI's argv template)")
        self.command = list(command)
        # IS_SANDBOX=1 (added by run_agent_sandbox): what the reference's wrapper sets for Claude Code (it then
        # accepts --dangerously-skip-permissions whatever uid it runs as); it says only that the agent is sandboxed
        self.launcher = launcher or InProcessLauncher(
            AgentWalls(
                read_paths=tuple(read_paths),
                network=network,
                env=dict(extra_env or {}),
                allow_hosts=tuple(allow_hosts),
                allow_private_hosts=tuple(allow_private_hosts),
            )
        )
        #: what the agent's network reaches decides whether the prototyping kit offers the run's tool services
        self.network = network
        self.model = model or ""
        self.effort = effort or ""

    async def propose(self, request: ProposalRequest) -> ProposerReport:
        report = ProposerReport(stopped_by="exit")
        scratch = Path(request.scratch_dir)
        scratch.mkdir(parents=True, exist_ok=True)
        prompt = task_prompt(dataclasses.replace(request, tools=None))  # its tools are its own
        inside = {
            "scratch": _SCRATCH_MARK,
            "archive": str(Path(request.archive_dir).resolve()),
            "skill": f"{_SCRATCH_MARK}/SKILL.md",
            "prompt": f"{_SCRATCH_MARK}/PROMPT.md",
            "n": str(request.count),
            "iteration": str(request.iteration),
            "max_turns": str(request.max_turns),
            "timeout": str(int(request.timeout_s)),
            "model": self.model,
            "effort": self.effort,
            "skill_text": SKILL_PREFIX + request.skill,
        }
        argv = render_command(self.command, inside)
        config = {
            "argv": argv,
            "mark": _SCRATCH_MARK,
            "timeout_s": float(request.timeout_s),
            "tail_bytes": OUTPUT_TAIL_BYTES,
            "sandboxed": request.isolation != "none",
            "max_files": MAX_BUNDLED_FILES,
            "max_file_bytes": MAX_CANDIDATE_BYTES,
        }
        # the kit's service clients only where the agent can reach the services (not without a network)
        kit = request.workspace if self.network != "none" else offline_kit(request.workspace, CLI_OFFLINE_README)
        files = {**kit, "PROMPT.md": prompt, "SKILL.md": request.skill, _CONFIG: json.dumps(config)}
        job = AgentJob(
            files=files,
            archive_dir=str(Path(request.archive_dir).resolve()),
            timeout_s=float(request.timeout_s),
            isolation="none" if request.isolation == "none" else "namespaces",
            services=kit_services(kit),
        )
        started = time.monotonic()
        try:
            result = await asyncio.to_thread(self.launcher.run, job)
        except ProposerUnavailable:
            raise  # no agent container to start it: the phase fails (fail closed), it never runs elsewhere
        except ProposerError as exc:
            report.stopped_by = "error"
            report.notes.append(str(exc))
            report.seconds = time.monotonic() - started
            return report
        report.seconds = time.monotonic() - started
        shown = [a.replace(_SCRATCH_MARK, "{scratch}") for a in argv]
        raw = result.files.get(_RESULT)
        if raw is None:
            report.stopped_by = "timeout" if result.outcome.value == "timeout" else "error"
            why = result.files_not_collected.get(_RESULT, result.describe())
            report.notes.append(f"the agent's sandbox ended without handing anything back ({result.describe()}): {why}")
            report.transcript.append(
                {
                    "argv": shown,
                    "returncode": result.returncode,
                    "isolation": result.isolation,
                    "stderr_tail": result.stderr[-4000:],
                }
            )
            return report
        try:
            bundle = json.loads(raw)
        except ValueError:
            bundle = {}
        if not isinstance(bundle, dict):
            bundle = {}
        if bundle.get("error"):
            report.stopped_by = "error"
            report.notes.append(str(bundle["error"])[:500])
        elif bundle.get("timed_out"):
            report.stopped_by = "timeout"
            report.notes.append(f"the proposer command ran past its {request.timeout_s:.0f} s timeout and was killed")
        elif bundle.get("returncode") not in (0, None):
            report.notes.append(f"the proposer command exited with status {bundle.get('returncode')}")
        for skipped in list(bundle.get("skipped") or [])[:20]:
            report.notes.append(f"ignored candidates/{str(skipped)[:200]}")
        tail = str(bundle.get("output_tail") or "")[-OUTPUT_TAIL_BYTES:]
        _usage(tail, report)
        report.transcript.append(
            {"argv": shown, "returncode": bundle.get("returncode"), "output_tail": tail, "isolation": result.isolation}
        )
        _write_back(scratch, bundle.get("files"))
        report.proposals, notes = collect_candidates(scratch, request.count)
        report.notes.extend(notes)
        return report


def _write_back(scratch: Path, files: Any) -> None:
    """The agent's candidates onto the host scratch, where :func:`collect_candidates` reads them."""
    out = scratch / CANDIDATES_DIR
    out.mkdir(parents=True, exist_ok=True)
    if not isinstance(files, dict):
        return
    for name, text in list(files.items())[:MAX_BUNDLED_FILES]:
        if not isinstance(name, str) or not isinstance(text, str) or not _FILE_NAME_RE.fullmatch(name):
            continue
        limit = MAX_CANDIDATE_BYTES + 1 if name.endswith(".py") else MAX_RATIONALE_BYTES
        (out / name).write_text(text[:limit], encoding="utf-8")


def _usage(tail: str, report: ProposerReport) -> None:
    """A Claude Code style JSON result in the output: its usage (the paper's count) and turns."""
    candidates = [tail.strip()] + [line.strip() for line in reversed(tail.splitlines()[-50:])]
    for text in candidates:
        if not text.startswith("{"):
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("usage"), dict):
            continue
        usage = data["usage"]

        def count(key: str, usage: dict[str, Any] = usage) -> int:
            value = usage.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

        report.generated_tokens = count("output_tokens")
        report.read_tokens = count("input_tokens") + count("cache_creation_input_tokens")
        report.tokens = report.generated_tokens + report.read_tokens
        turns = data.get("num_turns")
        if isinstance(turns, int) and not isinstance(turns, bool) and turns >= 0:
            report.turns = turns
        if data.get("is_error"):
            report.notes.append(f"the agent reported an error: {str(data.get('result', ''))[:300]}")
        return
