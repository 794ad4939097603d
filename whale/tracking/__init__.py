"""Metrics where researchers already look: TensorBoard, Weights & Biases and MLflow (like TRL's ``report_to``).

Off by default: the store keeps every metric either way, and these are mirrors of it. Two ways in:

- **live**, ``spec.execution.tracking.reportTo: [tensorboard, wandb, mlflow]``: each workload, once its phase has
  written its result, calls :func:`export_phase`, which logs that phase's points (weight steps, harness
  iterations with the accepted harness's code as an artifact, or the evaluation) — so a tracker fills up
  phase by phase while the run goes on;
- **afterwards**, ``whale report STORE --export tensorboard|wandb|mlflow``: :func:`export_series`
  replays whole runs from the store (cluster runs whose pods could not reach a tracker, old runs).

What is logged, on which x axis (:data:`AXES`):

=================  =====================================  ================================================
namespace          x                                      scalars
=================  =====================================  ================================================
``weight/``        global RSFT step                       reward_mean, kept_fraction, kept, loss,
                                                          learning_rate, epoch, rollouts_spent
``harness/``       harness iteration, counted run-wide    best_score, candidates_scored, rollouts_spent
``eval/``          training rollouts spent                mean_at_k, step
``eval_by_step/``  global RSFT step                       mean_at_k, rollouts_spent
=================  =====================================  ================================================

One tracker run per WhaleRun: W&B's run id and MLflow's ``whale.run-id`` tag are derived from the run's
place in its store, so every phase's process (and a later export) writes to the same tracker run.
A tracker that fails is logged with its traceback and skipped (the phase is done; the store has
everything; ``whale report --export`` can fill the gap) — it never fails a run.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from whale.core.convert import raw_section

log = logging.getLogger(__name__)

#: namespace -> the name of its x axis
AXES: dict[str, str] = {"weight": "step", "harness": "iteration", "eval": "rollouts", "eval_by_step": "step"}
DEFAULT_PROJECT = "whale"


class Backend(str, enum.Enum):
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"


class TrackingError(RuntimeError):
    """A tracker cannot be opened (its package missing, its server refusing); the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Point:
    """Scalars at one x of one namespace."""

    namespace: str
    x: int
    scalars: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """Who the tracker run is: the WhaleRun's name, and a stable id from its place in the store."""

    name: str
    #: the run's prefix as a URI, e.g. file:///…/runs/r1 (different stores -> different tracker runs)
    source: str

    @property
    def run_id(self) -> str:
        digest = hashlib.sha256(self.source.encode("utf-8")).hexdigest()[:10]
        return f"{self.name}-{digest}"


class Tracker(abc.ABC):
    """One tracker run of one backend."""

    backend: Backend

    @abc.abstractmethod
    def log(self, points: Sequence[Point]) -> None:
        """Log points (in order)."""

    @abc.abstractmethod
    def artifact(self, name: str, text: str) -> None:
        """Keep a text file (an accepted harness's code) with the run, under ``name``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release (the tracker run stays resumable by the next phase)."""


# ----- what to log: pure ------------------------------------------------------------------------------


def points(series: Any, phases: Iterable[str] | None = None) -> list[Point]:
    """The points of a :class:`~whale.report.series.RunSeries` (only those of ``phases`` when given)."""
    keep = None if phases is None else set(phases)

    def wanted(phase: str) -> bool:
        return keep is None or phase in keep

    out: list[Point] = []
    for s in series.weight_steps:
        if wanted(s.phase):
            scalars = {
                "reward_mean": s.reward_mean,
                "kept_fraction": s.kept_fraction,
                "kept": float(s.kept),
                "learning_rate": s.learning_rate,
                "epoch": s.epoch,
                "rollouts_spent": float(s.rollouts),
            }
            if s.loss is not None:
                scalars["loss"] = s.loss
            out.append(Point("weight", s.step, scalars))
    for h in series.harness_iterations:
        if wanted(h.phase):
            out.append(
                Point(
                    "harness",
                    h.index,
                    {
                        "best_score": h.best_score,
                        "candidates_scored": float(len(h.candidate_scores)),
                        "rollouts_spent": float(h.rollouts),
                    },
                )
            )
    for e in series.evals:
        if e.mean_at_k is not None and wanted(e.phase):
            out.append(Point("eval", e.rollouts, {"mean_at_k": e.mean_at_k, "step": float(e.step)}))
            out.append(Point("eval_by_step", e.step, {"mean_at_k": e.mean_at_k, "rollouts_spent": float(e.rollouts)}))
    return out


def export_series(
    series: Any,
    trackers: Sequence[Tracker],
    harness_code: Mapping[str, str] | None = None,
    phases: Iterable[str] | None = None,
) -> int:
    """Log a series' points (and the accepted harnesses' code) to every tracker; returns the points logged."""
    selected = points(series, phases)
    for tracker in trackers:
        tracker.log(selected)
        for phase, code in (harness_code or {}).items():
            if phases is None or phase in set(phases):
                tracker.artifact(f"{phase}-accepted.py", code)
    return len(selected)


# ----- the backends -----------------------------------------------------------------------------------


def _needs(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackingError(
            f"tracking backend {extra!r} needs the {module} package: pip install -e '.[{extra}]' in the checkout"
        ) from None


class TensorBoardTracker(Tracker):
    """Event files (tensorboardX) in ``logdir``; the harness code as text summaries."""

    backend = Backend.TENSORBOARD

    def __init__(self, logdir: Path, suffix: str = ""):
        tbx = _needs("tensorboardX", "tensorboard")
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        # one events file per writer; the suffix (the phase) keeps two writers of one second apart
        self.writer = tbx.SummaryWriter(logdir=str(self.logdir), filename_suffix=f".{suffix}" if suffix else "")

    def log(self, points: Sequence[Point]) -> None:
        for p in points:
            for key, value in p.scalars.items():
                self.writer.add_scalar(f"{p.namespace}/{key}", value, global_step=p.x)

    def artifact(self, name: str, text: str) -> None:
        self.writer.add_text(f"harness/{name}", "```python\n" + text + "\n```")

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbTracker(Tracker):
    """A W&B run (online, or offline with ``WANDB_MODE=offline``), resumed by every phase of the WhaleRun."""

    backend = Backend.WANDB

    def __init__(self, identity: RunIdentity, project: str, config: Mapping[str, Any]):
        wandb = _needs("wandb", "wandb")
        self.wandb = wandb
        # WANDB_DIR read here, per run: W&B caches its settings per process at the first init
        self.run = wandb.init(
            project=project,
            name=identity.name,
            id=identity.run_id,
            resume="allow",
            config=dict(config),
            dir=os.environ.get("WANDB_DIR") or None,
            settings=wandb.Settings(console="off"),
        )
        for namespace, axis in AXES.items():
            self.run.define_metric(f"{namespace}/{axis}", hidden=True)
            self.run.define_metric(f"{namespace}/*", step_metric=f"{namespace}/{axis}")

    def log(self, points: Sequence[Point]) -> None:
        for p in points:
            self.run.log(
                {**{f"{p.namespace}/{k}": v for k, v in p.scalars.items()}, f"{p.namespace}/{AXES[p.namespace]}": p.x}
            )

    def artifact(self, name: str, text: str) -> None:
        art = self.wandb.Artifact(_artifact_name(f"{self.run.name}-{name}"), type="harness")
        with art.new_file(name) as fh:
            fh.write(text)
        self.run.log_artifact(art)

    def close(self) -> None:
        self.run.finish()
        # finish() returns before W&B's service has written everything (seen offline); teardown waits for it
        self.wandb.teardown()


class MlflowTracker(Tracker):
    """An MLflow run in experiment ``project``, found again by its ``whale.run-id`` tag
    (tracking server from ``MLFLOW_TRACKING_URI``, as MLflow reads it)."""

    backend = Backend.MLFLOW
    BATCH = 1000  # MLflow's limit of metrics per log_batch

    def __init__(self, identity: RunIdentity, project: str, params: Mapping[str, str]):
        mlflow = _needs("mlflow", "mlflow")
        self.mlflow = mlflow
        self.client = mlflow.MlflowClient()
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
        found = self.client.search_runs(
            [exp_id], filter_string=f"tags.`whale.run-id` = '{identity.run_id}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
        else:
            run = self.client.create_run(
                exp_id,
                run_name=identity.name,
                tags={"whale.run-id": identity.run_id, "whale.run": identity.name, "whale.source": identity.source},
            )
            self.run_id = run.info.run_id
            for key, value in params.items():
                self.client.log_param(self.run_id, key, value)

    def log(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(key=f"{p.namespace}/{k}", value=float(v), timestamp=0, step=p.x)
            for p in points
            for k, v in p.scalars.items()
        ]
        for start in range(0, len(metrics), self.BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + self.BATCH])

    def artifact(self, name: str, text: str) -> None:
        self.client.log_text(self.run_id, text, f"harnesses/{name}")

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


def _artifact_name(text: str) -> str:
    """W&B artifact names allow letters, digits, '-', '_' and '.'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


def open_trackers(
    backends: Iterable[Backend | str],
    identity: RunIdentity,
    *,
    spec_wire: Mapping[str, Any],
    project: str | None = None,
    tensorboard_dir: Path | str = ".whale/tensorboard",
    writer: str = "export",
) -> list[Tracker]:
    """One tracker per backend, for the run ``identity``; TensorBoard writes to ``tensorboard_dir/<name>``
    (an events file per ``writer``: the phase that logs, or ``export``)."""
    project = project or DEFAULT_PROJECT
    out: list[Tracker] = []
    try:
        for backend in dict.fromkeys(Backend(b) for b in backends):
            if backend is Backend.TENSORBOARD:
                out.append(TensorBoardTracker(Path(tensorboard_dir) / identity.name, suffix=writer))
            elif backend is Backend.WANDB:
                out.append(WandbTracker(identity, project, spec_wire))
            else:
                params = {
                    "domain": str(spec_wire.get("domain")),
                    "condition": str(spec_wire.get("condition")),
                    "model": str((raw_section(spec_wire, "model") or {}).get("name")),
                }
                out.append(MlflowTracker(identity, project, params))
    except BaseException:
        close_all(out)
        raise
    return out


def close_all(trackers: Iterable[Tracker]) -> None:
    for tracker in trackers:
        try:
            tracker.close()
        except Exception:  # one tracker's failure must not keep the others open
            log.warning("closing the %s tracker failed", tracker.backend.value, exc_info=True)


# ----- the workloads' hook ----------------------------------------------------------------------------


def export_phase(store: Any, run: str, phase: str) -> int:
    """Log one finished phase to the trackers its spec names (``spec.execution.tracking.reportTo``); 0 when none.

    Called by ``python -m whale.workloads`` after the workload returned (its result is in the store).
    Only rank 0 of a distributed weight phase logs. A failing tracker is logged and skipped, never raised:
    the phase is done and the store holds its metrics."""
    if os.environ.get("RANK", "0") != "0":
        return 0
    from whale.core import layout
    from whale.core.spec import WhaleRunSpec
    from whale.report.series import parse_eval_phase, parse_main_phase

    if parse_main_phase(phase) is None and parse_eval_phase(phase) is None:
        return 0  # e.g. the prepare workload
    backends = "the trackers"
    try:
        raw = store.read_json_or_none(layout.spec_key(run))  # the run's spec, as the phase's workload read it
        if not isinstance(raw, dict):
            return 0
        spec = WhaleRunSpec.model_validate(raw)
        if not spec.execution.tracking.report_to:
            return 0
        backends = ", ".join(spec.execution.tracking.report_to)
        return _export_phase(store, run, phase, spec)
    except Exception:  # a mirror must not fail a finished phase; the traceback is logged
        log.warning(
            "tracking %s of %s to %s failed; the store keeps every metric (`whale report --export` replays them)",
            phase,
            run,
            backends,
            exc_info=True,
        )
        return 0


def _export_phase(store: Any, run: str, phase: str, spec: Any) -> int:
    from whale.report.series import build_series
    from whale.report.source import accepted_harnesses, read_run

    records = read_run(store, run)
    # the status may not know this phase's outcome yet: lay the run out from the phase results alone
    series = build_series(dataclasses.replace(records, status=None))
    identity = RunIdentity(name=run, source=records.source)
    trackers = open_trackers(
        spec.execution.tracking.report_to,
        identity,
        spec_wire=spec.to_wire(),
        project=spec.execution.tracking.project,
        tensorboard_dir=spec.execution.tracking.tensorboard_dir,
        writer=phase,
    )
    try:
        code = {p: c for p, c in accepted_harnesses(store, records).items() if p == phase}
        return export_series(series, trackers, code, phases=[phase])
    finally:
        close_all(trackers)
