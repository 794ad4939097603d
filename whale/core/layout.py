"""The object-store layout: the one contract between workloads and controllers.

Every path a workload writes or a controller reads is built here, from the run name and the
phase identity, so that the local runner, the operator and the three workloads can never disagree
about where a file lives. Pure: no I/O. ``docs/storage.md`` documents the same tree.

::

    runs/<run>/
      spec.json                          the manifest the run was started with (normalised)
      status.json                        the run status (local runner; the operator keeps it on the object)
      phases/<phase>/request.json        what the controller asked the workload to do (written before launch)
      phases/<phase>/metrics.jsonl       one JSON line per weight step / harness iteration / eval item batch
      phases/<phase>/result.json         written last and atomically: its presence means "phase done"
      phases/<phase>/STOP                a stop request (adaptive patience fired); the workload ends cleanly
      phases/<phase>/progress.json       where the running phase is now (stage, step, counts): for the CLI only
      phases/<phase>/state/...           workload-private resume state (optimiser, data order, RNG)
      phases/<phase>/replay/step-<NNNNNN>.safetensors   a step's kept trajectories as token ids (stepResume replay)
      phases/<phase>/logs/attempt-<n>.log   workload output (local runner)
      checkpoints/step-<NNNNNN>/...      HF checkpoint (safetensors + config + tokenizer); COMPLETE written last
      harnesses/<name>.py                harness programs (h0 and every accepted harness)
      harnesses/<name>.usage.json        an accepted harness's model usage on D_harness (the eval's split rule)
      archive/c<KK>/...                  the Meta-Harness archive of cycle KK (see docs/storage.md)
      evals/<phase>/per_item.jsonl       eval per-item scores (result.json of the eval phase holds the summary)
      evals/<phase>/traces/attempt-<n>-<chunk>.jsonl   eval episode traces, one object per chunk of items
      control/split_sizes.json           |D_weight|, |D_harness|, |D_test| the schedule was resolved with
      control/serving.json               {"checkpoint": key | null, "version"?}: what the inference server should serve
      control/served.json                {"checkpoint", "version", "at"}: what the weight-sync sidecar made vLLM serve
      control/lock.json                  the run lock: who runs it now (`whale run`; docs/storage.md "The run lock")
      control/child.json                 the local runner's latest child: phase, attempt, log file, started/ended
      control/stop.json                  `whale stop`: asks the runner that holds the lock to stop (resumable)
      sync/step-<NNNNNN>/...             per-step weights pushed to the inference server (the last two kept)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from whale.core.protocol import PhaseKind

RUNS_ROOT = "runs"
CHECKPOINT_COMPLETE_MARKER = "COMPLETE"
_STEP_DIR_RE = re.compile(r"^step-(\d{6,})$")

# ----- the run name: one rule for `whale validate`, the local runner and the operator ----------------

#: a Service name (DNS-1035 label) is at most this long
DNS_LABEL_MAX_LEN = 63
#: the longest suffix the operator appends to a run's name for a child it names ``<run>-<suffix>``:
#: the code sandbox's NetworkPolicy (``operator/whale_operator/names.py`` builds its fixed suffixes
#: within this; Jobs, whose suffix carries phase and attempt, are shortened with a hash instead)
LONGEST_CHILD_SUFFIX = "-sandbox-isolation"
#: so every such child keeps the whole run name: ``kubectl get svc <run>-vllm`` finds it
RUN_NAME_MAX_LEN = DNS_LABEL_MAX_LEN - len(LONGEST_CHILD_SUFFIX)
#: a DNS-1035 label: the run's name also names its Services, which must start with a letter
_RUN_NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def check_run_name(name: str) -> str:
    """The run's name (``metadata.name``) is a DNS-1035 label of at most ``RUN_NAME_MAX_LEN`` characters.

    The operator names the run's Services after it (so it must start with a letter) and appends
    suffixes to it; the store keys are under it. ``fullmatch``: ``re``'s ``$`` would also accept a
    trailing newline."""
    if not isinstance(name, str) or len(name) > RUN_NAME_MAX_LEN or not _RUN_NAME_RE.fullmatch(name):
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise ValueError(
            f"run name {shown} is not valid: use 1 to {RUN_NAME_MAX_LEN} lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit (a DNS-1035 label, with room for the "
            f"'{LONGEST_CHILD_SUFFIX}' suffix of the run's children)"
        )
    return name


def run_prefix(run: str) -> str:
    return f"{RUNS_ROOT}/{check_run_name(run)}"


# ----- phase identities -------------------------------------------------------------------------------

#: which point of the schedule an evaluation measures
EvalAfter = Literal["start", "weight", "harness"]
_PHASE_RE = re.compile(
    r"^(?:(?P<prepare>prepare)|c(?P<cycle>\d{2,})-(?P<main>weight|harness)"
    r"|eval-c(?P<ecycle>\d{2,})-s(?P<step>\d{6,})-(?P<after>start|weight|harness)(?:-i(?P<iteration>\d{4,}))?)$"
)


@dataclass(frozen=True, order=True)
class PhaseId:
    """Who a phase is: its kind and place in the schedule. ``key`` is its name in the store and in
    Kubernetes labels (``prepare``, ``c01-weight``, ``c01-harness``, ``eval-c01-s000004-weight[-i0007]``) and
    :meth:`parse` reads it back, so no caller builds or splits a phase key by hand.

    ``step``/``after``/``iteration`` belong to evaluations only: the step it evaluates, which point
    (start | weight | harness), and (mh_only) the search iteration whose accepted harness it runs."""

    kind: PhaseKind
    cycle: int
    step: int | None = None
    after: EvalAfter | None = None
    iteration: int | None = None

    def __post_init__(self) -> None:
        is_eval = self.kind is PhaseKind.EVAL
        if self.cycle < 0 or (is_eval and (self.step is None or self.step < 0 or self.after is None)):
            raise ValueError(f"not a phase identity: {self!r}")
        if not is_eval and (self.step, self.after, self.iteration) != (None, None, None):
            raise ValueError(f"only an evaluation has a step, point or iteration: {self!r}")

    @classmethod
    def prepare(cls) -> PhaseId:
        """Data preparation: the run's one phase before the schedule (it needs the split sizes it writes)."""
        return cls(PhaseKind.PREPARE, 0)

    @classmethod
    def weight(cls, cycle: int) -> PhaseId:
        return cls(PhaseKind.WEIGHT, cycle)

    @classmethod
    def harness(cls, cycle: int) -> PhaseId:
        return cls(PhaseKind.HARNESS, cycle)

    @classmethod
    def eval(cls, cycle: int, step: int, after: EvalAfter, iteration: int | None = None) -> PhaseId:
        return cls(PhaseKind.EVAL, cycle, step, after, iteration)

    @classmethod
    def parse(cls, key: str) -> PhaseId:
        """The identity a key names; ValueError for anything that is not a phase key."""
        m = _PHASE_RE.match(key)
        if m is None:
            raise ValueError(f"not a phase key: {key!r}")
        if m["prepare"]:
            return cls.prepare()
        if m["main"]:
            return cls(PhaseKind(m["main"]), int(m["cycle"]))
        iteration = int(m["iteration"]) if m["iteration"] else None
        return cls.eval(int(m["ecycle"]), int(m["step"]), m["after"], iteration)  # type: ignore[arg-type]

    @property
    def key(self) -> str:
        if self.kind is PhaseKind.EVAL:
            key = f"eval-c{self.cycle:02d}-s{self.step:06d}-{self.after}"
            return key if self.iteration is None else f"{key}-i{self.iteration:04d}"
        if self.kind is PhaseKind.PREPARE:
            return PhaseKind.PREPARE.value
        return f"c{self.cycle:02d}-{self.kind.value}"

    def __str__(self) -> str:
        return self.key


def weight_phase_key(cycle: int) -> str:
    return PhaseId.weight(cycle).key


def harness_phase_key(cycle: int) -> str:
    return PhaseId.harness(cycle).key


def eval_phase_key(cycle: int, step: int, after: EvalAfter, iteration: int | None = None) -> str:
    """``after`` says which point it evaluates: start | weight | harness; ``iteration`` (mh_only) the
    harness-search iteration whose accepted harness it evaluates (``eval-c01-s000000-harness-i0007``)."""
    return PhaseId.eval(cycle, step, after, iteration).key


# ----- per-run files ------------------------------------------------------------------------------------


def spec_key(run: str) -> str:
    return f"{run_prefix(run)}/spec.json"


def status_key(run: str) -> str:
    return f"{run_prefix(run)}/status.json"


def phases_prefix(run: str) -> str:
    """The folder that holds one folder per phase (``phases/<phase>/``)."""
    return f"{run_prefix(run)}/phases/"


def phase_prefix(run: str, phase: str) -> str:
    return f"{run_prefix(run)}/phases/{phase}"


def request_key(run: str, phase: str) -> str:
    return f"{phase_prefix(run, phase)}/request.json"


def metrics_key(run: str, phase: str) -> str:
    return f"{phase_prefix(run, phase)}/metrics.jsonl"


def result_key(run: str, phase: str) -> str:
    return f"{phase_prefix(run, phase)}/result.json"


def stop_key(run: str, phase: str) -> str:
    return f"{phase_prefix(run, phase)}/STOP"


def progress_key(run: str, phase: str) -> str:
    """Where the running phase is now (``protocol.PhaseProgress``), replaced by the workload as it moves;
    for people watching (`whale run`'s display). Advisory: no controller decides on it."""
    return f"{phase_prefix(run, phase)}/progress.json"


def state_prefix(run: str, phase: str) -> str:
    return f"{phase_prefix(run, phase)}/state"


def replay_prefix(run: str, phase: str) -> str:
    """The phase's replay records (``rsft.stepResume: replay``): one per step done since its last checkpoint."""
    return f"{phase_prefix(run, phase)}/replay"


def replay_key(run: str, phase: str, step: int) -> str:
    """The kept trajectories (token ids and labels) of global step ``step`` (steps done, 1-based)."""
    return f"{replay_prefix(run, phase)}/step-{step:06d}.safetensors"


def log_key(run: str, phase: str, attempt: int) -> str:
    return f"{phase_prefix(run, phase)}/logs/attempt-{attempt}.log"


def checkpoints_prefix(run: str) -> str:
    return f"{run_prefix(run)}/checkpoints"


def checkpoint_prefix(run: str, step: int) -> str:
    return f"{checkpoints_prefix(run)}/step-{step:06d}"


def checkpoint_complete_key(run: str, step: int) -> str:
    return f"{checkpoint_prefix(run, step)}/{CHECKPOINT_COMPLETE_MARKER}"


def parse_checkpoint_step(dirname: str) -> int | None:
    """``step-000044`` -> 44; anything else -> None."""
    match = _STEP_DIR_RE.match(dirname)
    return int(match.group(1)) if match else None


def harness_key(run: str, name: str) -> str:
    return f"{run_prefix(run)}/harnesses/{name}.py"


def harness_usage_key(harness: str) -> str:
    """Beside a harness file the search hands on: its model usage on D_harness (the evaluation's split rule)."""
    return harness.removesuffix(".py") + ".usage.json"


def archive_prefix(run: str, cycle: int) -> str:
    return f"{run_prefix(run)}/archive/c{cycle:02d}"


def archive_candidates_prefix(run: str, cycle: int) -> str:
    """Folder (with the trailing '/') of the archive's candidates: ``<id>/harness.py`` is each one's code."""
    return f"{archive_prefix(run, cycle)}/candidates/"


def eval_items_key(run: str, phase: str) -> str:
    return f"{run_prefix(run)}/evals/{phase}/per_item.jsonl"


def eval_traces_prefix(run: str, phase: str) -> str:
    """Folder (with the trailing '/') of an eval phase's trace chunks."""
    return f"{run_prefix(run)}/evals/{phase}/traces/"


def split_sizes_key(run: str) -> str:
    """The split sizes the run's schedule is resolved with: written once by whoever can read the data
    (the local runner, or the prepare workload on a cluster), read by the operator, which has no data."""
    return f"{run_prefix(run)}/control/split_sizes.json"


def lock_key(run: str) -> str:
    """The run lock of the local runner: held for the life of one `whale run` (an flock on a folder store,
    a renewed lease object on S3), so a run never has two controllers writing it."""
    return f"{run_prefix(run)}/control/lock.json"


def child_key(run: str) -> str:
    """The local runner's latest child (phase, attempt, log file, start and end): what `whale logs` follows
    and `whale list` shows while the run lock is held."""
    return f"{run_prefix(run)}/control/child.json"


def stop_request_key(run: str) -> str:
    """`whale stop NAME`: a request to the runner that holds the run lock (named by its owner id) to stop
    its children and save the status as interrupted; polled by the runner, so it works on any store."""
    return f"{run_prefix(run)}/control/stop.json"


def serving_key(run: str) -> str:
    """The checkpoint the inference server should serve (read by the weight-sync sidecar)."""
    return f"{run_prefix(run)}/control/serving.json"


def data_prefix(domain: str) -> str:
    """Materialised splits of a domain, shared by every run in the store."""
    return f"data/{domain}"


def served_key(run: str) -> str:
    """The inference server's acknowledgement ``{"checkpoint": key | null, "version": v, "at": time}``:
    written by the weight-sync sidecar once vLLM serves what ``serving_key`` asked for."""
    return f"{run_prefix(run)}/control/served.json"


def sync_prefix(run: str) -> str:
    """Folder of the per-step weights a weight phase publishes for the inference server to reload
    (a cluster's store-based sync; only the last two are kept)."""
    return f"{run_prefix(run)}/sync"


def sync_step_prefix(run: str, step: int) -> str:
    """``sync/step-<NNNNNN>``: the weights after global step ``step``; COMPLETE written last."""
    return f"{sync_prefix(run)}/step-{step:06d}"
