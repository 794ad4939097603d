"""The proposer interface: a coding agent that reads the archive and writes new harness files.

Every backend gets a :class:`ProposalRequest` (a read-only local copy of the archive, a scratch
directory, the domain's SKILL.md, the incoming harness, the budgets, and the sandboxed tools of
:mod:`whale.metaharness.proposer.tools`: ``run_candidate`` and ``run_shell``) and returns a
:class:`ProposerReport`. Whatever a backend produces is untrusted: files are collected from
``<scratch>/candidates/`` with size caps (:func:`collect_candidates`), and the search loop validates
each one. A backend never raises for the agent's own failures (budget exhausted, a bad tool call,
a crashed CLI): those become ``notes`` in the report, and the iteration goes on with whatever valid
candidates exist. It raises :class:`ProposerError` only for setup mistakes (no endpoint, no key).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from whale.metaharness.proposer.tools import ProposerTools

#: where candidates go inside the scratch directory
CANDIDATES_DIR = "candidates"
#: the largest candidate / rationale file collected
MAX_CANDIDATE_BYTES = 200_000
MAX_RATIONALE_BYTES = 8_000


class ProposerError(RuntimeError):
    """The proposer cannot run at all (misconfiguration); the message says what to fix."""


class ProposerUnavailable(ProposerError):
    """What must start the proposer is not there (a cluster's ``proposer-agent`` container that never answered): the
    harness phase fails, naming it, rather than going on without a proposer or starting it anywhere else."""


@dataclasses.dataclass(frozen=True)
class ProposalRequest:
    """What one proposer call gets."""

    iteration: int
    #: how many candidates to write (proposalsPerIteration)
    count: int
    #: local, read-only copy of the archive (the proposer's filesystem)
    archive_dir: Path
    #: where the candidates go (``candidates/<name>.py`` + optional ``candidates/<name>.md`` rationale)
    scratch_dir: Path
    #: the domain's SKILL.md text
    skill: str
    #: the harness this phase started from, and its archive id
    incoming_code: str
    incoming_id: str
    #: FST baseline: only the two prompt constants may change
    prompt_only: bool
    allowed_imports: tuple[str, ...]
    #: budgets
    timeout_s: float
    max_turns: int
    #: the paper's count (:class:`TokenMeter`): tokens generated plus tokens read for the first time
    max_tokens: int
    #: the sandboxed tools beside the file tools (``run_candidate`` on D_harness items, ``run_shell``
    #: over the archive copy); None: file tools only
    tools: ProposerTools | None = None
    #: ``spec.execution.sandbox.isolation``: how the ``cli`` backend's agent process is walled off
    isolation: str = "namespaces"
    #: files put into the agent's workspace beside PROMPT.md and SKILL.md (path -> text): the prototyping
    #: kit (:mod:`whale.metaharness.proposer.kit`)
    workspace: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Proposal:
    """One candidate file as the proposer wrote it (still untrusted)."""

    name: str
    code: str
    rationale: str = ""


class TokenMeter:
    """The proposer's token budget as the paper counts it: per iteration, the tokens the model
    generated plus the tokens it read **for the first time** — not the whole context again on every call.

    A chat API is stateless: call ``i`` sends the whole conversation, so its prompt is the previous
    call's prompt and reply plus what was added since (tool results, a nudge). Call ``i`` is charged
    ``completion_i + max(0, prompt_i - (prompt_{i-1} + completion_{i-1}))``; the first call pays its
    whole prompt (system prompt, task, skill). ``prompt`` is the whole prompt as the API counted it —
    for the Anthropic API ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``
    (its ``input_tokens`` leaves the cached part out). When older tool results are elided to save
    context the prompt shrinks and nothing is charged for it. A backend that reports no usage is
    charged the same way on estimates (``len(text) // 4``).
    """

    def __init__(self) -> None:
        self.generated = 0
        self.read = 0
        self._context = 0

    @property
    def total(self) -> int:
        return self.generated + self.read

    def charge(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Account one model call; returns what it cost."""
        prompt_tokens, completion_tokens = max(int(prompt_tokens), 0), max(int(completion_tokens), 0)
        new = max(0, prompt_tokens - self._context)
        self.read += new
        self.generated += completion_tokens
        self._context = prompt_tokens + completion_tokens
        return new + completion_tokens


@dataclasses.dataclass
class ProposerReport:
    """What came back from one proposer call, and what it cost."""

    proposals: list[Proposal] = dataclasses.field(default_factory=list)
    #: problems worth recording: budget exhaustion, refused writes, a crashed CLI, ...
    notes: list[str] = dataclasses.field(default_factory=list)
    turns: int = 0
    #: the budgeted count (:class:`TokenMeter`): ``generated_tokens + read_tokens``
    tokens: int = 0
    #: tokens the model generated
    generated_tokens: int = 0
    #: context tokens it read for the first time
    read_tokens: int = 0
    #: D_harness rollouts its ``run_candidate`` calls spent (the search loop counts them from the tool)
    trial_rollouts: int = 0
    seconds: float = 0.0
    #: finish | max_turns | max_tokens | timeout | no_tool_calls | exit | error
    stopped_by: str = "finish"
    #: conversation / output lines, stored in the archive
    transcript: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        return {
            "proposals": [p.name for p in self.proposals],
            "notes": self.notes,
            "turns": self.turns,
            "tokens": self.tokens,
            "generated_tokens": self.generated_tokens,
            "read_tokens": self.read_tokens,
            "trial_rollouts": self.trial_rollouts,
            "seconds": round(self.seconds, 3),
            "stopped_by": self.stopped_by,
        }


class Proposer(abc.ABC):
    """A coding agent behind one interface."""

    #: backend name recorded in the archive
    backend: str = "?"

    @abc.abstractmethod
    async def propose(self, request: ProposalRequest) -> ProposerReport:
        """Write up to ``request.count`` candidates; never raises for the agent's own failures."""

    async def aclose(self) -> None:
        """Release connections. Idempotent."""


def task_prompt(request: ProposalRequest) -> str:
    """The task statement every backend gives its agent (the CLI gets it as PROMPT.md)."""
    rules = [
        f"Write exactly {request.count} new harness candidate file(s), each one complete Python file "
        "defining `class Harness(BaseHarness)` (from whale.harness.api).",
        "One mechanism per candidate; no parameter-only tweaks; no branches on specific questions or items.",
        f"Allowed imports: whale.harness.api, {', '.join(sorted(request.allowed_imports)) or '(nothing else)'}.",
        "Read the archive first: summary.md, the best candidates' harness.py, and their traces.jsonl "
        "(failed episodes show what to fix).",
        "You may re-propose an earlier candidate's code unchanged (a revert): it is not evaluated again.",
        "The reward must come through the model's replies: the answer graded must be text the model wrote in "
        "that episode (choose which reply is final, cut the answer out of it; an answer the harness writes "
        "itself scores 0). A candidate whose rewarded episodes never call the model, that submits answers the "
        "model did not write or tells it the answer, or that scores higher while the model's output collapses, "
        "is flagged for reward integrity (see `integrity_flags` in summary.json) and, by default, never accepted.",
    ]
    tools = request.tools
    if tools is not None and tools.trials is not None:
        rules.append(
            f"`run_candidate` runs a candidate you wrote on up to {tools.trials.max_items} training (D_harness) items "
            f"with the real model and returns its score, errors and short traces; it spends rollouts from a budget of "
            f"{tools.trials.budget} for this iteration."
        )
    if tools is not None and tools.tryouts is not None and tools.tryouts.calls > 0:
        rules.append(
            f"`try_harness` prototypes a harness on up to {tools.tryouts.max_items} real training (D_harness) tasks "
            "with model replies you script: its hooks run in the real sandbox and its tool calls reach the run's "
            "real tools (call its search on 3-5 real questions and read what comes back); nothing is graded and no "
            f"rollout is spent ({tools.tryouts.calls} calls this iteration)."
        )
    if tools is not None and tools.shell is not None:
        rules.append(
            "`run_shell` runs one bash command in a fresh sandbox whose working directory is the read-only archive "
            "(ls, grep, head, wc, python3 with the standard library; no network; a scratch home)."
        )
    if tools is not None and tools.shell is not None and request.workspace:
        rules.append(
            "`proto/` in the archive holds the harness API, the incoming harness and the D_harness tasks (no gold; "
            "`proto/README.md`): in `run_shell`, `python3` with `proto/` on `sys.path` imports them, so you can call "
            "a harness's hooks on real tasks offline."
        )
    if request.prompt_only:
        rules.append(
            "PROMPT-ONLY MODE: outside the values of SYSTEM_PROMPT and USER_TEMPLATE your file must be "
            f"identical to the incoming harness ({request.incoming_id}); both values must be plain string literals."
        )
    return (
        f"# Harness search, iteration {request.iteration}\n\n"
        "You improve the harness of an LLM agent: the Python file that builds its prompts and parses its "
        "replies. Candidates are scored by success rate on a fixed training split; ties go to fewer turns.\n\n"
        "## Rules\n" + "".join(f"- {r}\n" for r in rules) + "\n"
        "## The archive\n"
        "`summary.md` lists every candidate with its status and score; `candidates/<id>/` holds each one's "
        "`harness.py`, `rationale.md`, `scores.json`, `traces.jsonl` and `error.txt`.\n\n"
        f"## The incoming harness ({request.incoming_id})\n```python\n{request.incoming_code.strip()}\n```\n\n"
        "## Domain skill\n" + request.skill.strip() + "\n"
    )


def collect_candidates(
    scratch_dir: Path, count: int, order: list[str] | None = None
) -> tuple[list[Proposal], list[str]]:
    """Candidate files under ``<scratch>/candidates/`` (``NAME.py`` + optional ``NAME.md``), at most
    ``count``, each within the size caps; in ``order`` (names as written) when given, else by name.
    Returns (proposals, notes)."""
    root = Path(scratch_dir) / CANDIDATES_DIR
    notes: list[str] = []
    if not root.is_dir():
        return [], [f"no {CANDIDATES_DIR}/ directory was written"]
    rank = {name: i for i, name in enumerate(order or [])}
    files = sorted(
        (p for p in root.iterdir() if p.suffix == ".py" and p.is_file() and not p.is_symlink()),
        key=lambda p: (rank.get(p.stem, len(rank)), p.name),
    )
    proposals: list[Proposal] = []
    for path in files:
        if len(proposals) == count:
            notes.append(f"ignored {path.name}: more than {count} candidates")
            continue
        size = path.stat().st_size
        if size > MAX_CANDIDATE_BYTES:
            notes.append(f"ignored {path.name}: {size} bytes > {MAX_CANDIDATE_BYTES}")
            continue
        code = path.read_bytes().decode("utf-8", errors="replace")
        rationale_path = path.with_suffix(".md")
        rationale = ""
        if rationale_path.is_file() and not rationale_path.is_symlink():
            rationale = rationale_path.read_bytes()[:MAX_RATIONALE_BYTES].decode("utf-8", errors="replace")
        proposals.append(Proposal(name=path.stem, code=code, rationale=rationale))
    return proposals, notes
