"""Reading runs for a report: which store and which runs an argument names, and their records.

Everything goes through the store client (:mod:`whale.store`), so a report reads a local folder, an
S3 bucket or a cluster's MinIO the same way, with the keys of :mod:`whale.core.layout`. What is read is
validated into the wire models of :mod:`whale.core.protocol` and :mod:`whale.core.spec`; a file that does not
parse is a :class:`ReportError` naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from whale.core import layout
from whale.core.protocol import (
    EvalResult,
    HarnessIterationMetrics,
    HarnessPhaseResult,
    PhaseKind,
    WeightPhaseResult,
    WeightStepMetrics,
)
from whale.core.spec import WhaleRunSpec
from whale.core.status import WhaleRunStatus
from whale.report.compare import CompareRun, group_name
from whale.report.series import (
    PhaseRecords,
    RunRecords,
    RunSeries,
    build_series,
    parse_eval_phase,
    parse_main_phase,
    unique_labels,
)
from whale.store import Store, StoreError, open_store


class ReportError(ValueError):
    """A report cannot be made; the message names the store, the run or the file, and what to do."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One command-line argument: a store, and the run it names if it ends in ``runs/<name>``."""

    store_uri: str
    run: str | None = None


def parse_source(arg: str) -> Source:
    """``DIR`` / ``s3://bucket/prefix`` (a store) or ``…/runs/NAME`` (one run of that store)."""
    text = arg.strip()
    if not text:
        raise ReportError("an empty store argument: give a folder, file:///folder or s3://bucket/prefix")
    trimmed = text.rstrip("/")
    head, sep, name = trimmed.rpartition("/")
    parent, _, runs = head.rpartition("/")
    if sep and runs == layout.RUNS_ROOT and name:
        try:
            layout.check_run_name(name)
        except ValueError as exc:
            raise ReportError(f"{arg}: {exc}") from None
        # the store root is what precedes runs/NAME ("" -> the current folder; "s3:/" cannot happen: a bucket)
        root = parent if head != layout.RUNS_ROOT else "."
        if root.endswith(":/") or root.endswith(":"):
            raise ReportError(f"{arg}: no store before runs/{name}; give s3://bucket[/prefix]/runs/{name}")
        return Source(store_uri=root, run=name)
    return Source(store_uri=trimmed or text)


def list_runs(store: Store) -> list[str]:
    """The runs of a store: folders under ``runs/`` that hold a spec.json (a run that has started)."""
    out = []
    for child in store.list(layout.RUNS_ROOT, recursive=False):
        name = child.rstrip("/").rsplit("/", 1)[-1]
        try:
            layout.check_run_name(name)
        except ValueError:
            continue  # not a run's folder (runs are named as Kubernetes objects)
        if child.endswith("/") and store.exists(layout.spec_key(name)):
            out.append(name)
    return out


def _model(store: Store, key: str, model: type[BaseModel], raw: Any) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "(top level)"
        raise ReportError(
            f"{store.uri_for(key)} is not a valid {model.__name__}: {where}: {first.get('msg')} "
            f"(written by another version of whale? report with the same version)"
        ) from None


def _lines(store: Store, key: str, model: type[BaseModel]) -> tuple[Any, ...]:
    return tuple(_model(store, f"{key} line {i}", model, raw) for i, raw in enumerate(store.read_jsonl(key), 1))


def read_run(store: Store, name: str) -> RunRecords:
    """The records of run ``name``: spec, status (when in the store), main phases, evaluation results."""
    spec_raw = store.read_json_or_none(layout.spec_key(name))
    if spec_raw is None:
        raise ReportError(
            f"no run named {name!r} in {store.uri} (no {layout.spec_key(name)}); "
            f"runs there: {', '.join(list_runs(store)) or 'none'}"
        )
    spec = _model(store, layout.spec_key(name), WhaleRunSpec, spec_raw)
    status_raw = store.read_json_or_none(layout.status_key(name))
    status = None if status_raw is None else _model(store, layout.status_key(name), WhaleRunStatus, status_raw)
    phases: list[PhaseRecords] = []
    evals: dict[str, EvalResult] = {}
    root = f"{layout.run_prefix(name)}/phases"
    for child in store.list(root, recursive=False):
        phase = child.rstrip("/").rsplit("/", 1)[-1]
        result_raw = store.read_json_or_none(layout.result_key(name, phase))
        metrics_key = layout.metrics_key(name, phase)
        main = parse_main_phase(phase)
        if main is not None:
            kind = main[1]
            if kind is PhaseKind.WEIGHT:
                result = (
                    None
                    if result_raw is None
                    else _model(store, layout.result_key(name, phase), WeightPhaseResult, result_raw)
                )
                phases.append(
                    PhaseRecords(
                        phase, kind, weight_metrics=_lines(store, metrics_key, WeightStepMetrics), result=result
                    )
                )
            else:
                result = (
                    None
                    if result_raw is None
                    else _model(store, layout.result_key(name, phase), HarnessPhaseResult, result_raw)
                )
                phases.append(
                    PhaseRecords(
                        phase, kind, harness_metrics=_lines(store, metrics_key, HarnessIterationMetrics), result=result
                    )
                )
        elif parse_eval_phase(phase) is not None and result_raw is not None:
            evals[phase] = _model(store, layout.result_key(name, phase), EvalResult, result_raw)
    return RunRecords(
        name=name,
        source=store.uri_for(layout.run_prefix(name)),
        spec=spec,
        status=status,
        phases=tuple(phases),
        evals=evals,
    )


StoreOpener = Callable[[str], Store]


def open_for_reading(uri: str) -> Store:
    """Open a store without creating it: a report must not leave an empty folder behind a typo.
    S3 settings come from the environment, as for every command (``WHALE_S3_ENDPOINT``,
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``; docs/storage.md)."""
    if not uri.startswith("s3://"):
        path = Path(uri[len("file://") :] if uri.startswith("file://") else uri).expanduser()
        if "://" not in uri.replace("file://", "", 1) and not path.is_dir():
            raise ReportError(
                f"{uri}: no such folder; give the --store folder `whale run` used "
                "(default .whale/store) or s3://bucket/prefix"
            )
    return open_store(uri)


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """One run of a report: its store, what was read, and its series."""

    store: Store
    records: RunRecords
    series: RunSeries


def load_series(
    args: Sequence[str], runs: Sequence[str] = (), opener: StoreOpener = open_for_reading
) -> list[RunSeries]:
    """The series of every run the arguments name (see :func:`load_runs`)."""
    return [run.series for run in load_runs(args, runs, opener)]


def load_runs(args: Sequence[str], runs: Sequence[str] = (), opener: StoreOpener = open_for_reading) -> list[LoadedRun]:
    """Every run the arguments name, in argument order (in the order of ``runs`` when given).

    ``args``: stores (``DIR``, ``file:///DIR``, ``s3://bucket/prefix``) or runs (``STORE/runs/NAME``).
    ``runs``: only these run names from the stores given whole (each must be found in one of them).
    A store given whole without ``runs`` contributes every run it holds."""
    if not args:
        raise ReportError("give at least one store (DIR or s3://bucket/prefix) or run (STORE/runs/NAME)")
    for name in runs:
        try:
            layout.check_run_name(name)
        except ValueError as exc:
            raise ReportError(f"--run: {exc}") from None
    wanted: list[tuple[Store, str]] = []
    found: set[str] = set()
    stores: dict[str, Store] = {}
    for arg in args:
        source = parse_source(arg)
        store = stores.get(source.store_uri)
        if store is None:
            try:
                store = opener(source.store_uri)
            except StoreError as exc:
                raise ReportError(f"{arg}: {exc}") from None
            stores[source.store_uri] = store
        try:
            if source.run is not None:
                names = [source.run]
            else:
                present = list_runs(store)
                names = [n for n in present if n in runs] if runs else present
                if not present:
                    raise ReportError(
                        f"{arg}: no runs in {store.uri} (no runs/<name>/spec.json); is this the "
                        "--store `whale run` used, or the spec.execution.storage.uri of the cluster run?"
                    )
            for name in names:
                if (store.uri, name) not in {(s.uri, n) for s, n in wanted}:
                    wanted.append((store, name))
                    found.add(name)
        except StoreError as exc:
            raise ReportError(f"{arg}: {exc}") from None
    if runs:  # the order of --run, as the command line gives it (a stable sort: stores in argument order)
        wanted.sort(key=lambda store_and_name: list(runs).index(store_and_name[1]))
    missing = [name for name in runs if name not in found]
    if missing:
        raise ReportError(f"--run {', '.join(missing)}: not found in {', '.join(s.uri for s in stores.values())}")
    labels = unique_labels([(name, store.uri) for store, name in wanted])
    out = []
    for (store, name), label in zip(wanted, labels, strict=True):
        try:
            records = read_run(store, name)
            out.append(LoadedRun(store, records, build_series(records, label=label)))
        except StoreError as exc:
            raise ReportError(f"run {name} in {store.uri}: {exc}") from None
    return out


def accepted_harnesses(store: Store, records: RunRecords) -> dict[str, str]:
    """``{harness phase: code}`` of every finished harness phase's accepted harness (exporters' artifacts)."""
    out = {}
    for p in records.phases:
        if isinstance(p.result, HarnessPhaseResult):
            try:
                out[p.phase] = store.read_text(p.result.accepted_harness)
            except StoreError:
                continue
    return out


def read_item_scores(store: Store, run: str, phase: str) -> dict[str, float]:
    """``{item id: mean reward}`` of one evaluation's per-item file (empty when the store has none)."""
    key = layout.eval_items_key(run, phase)
    out: dict[str, float] = {}
    for i, row in enumerate(store.read_jsonl(key), 1):
        rewards = row.get("rewards") if isinstance(row, dict) else None
        if "item_id" not in row or not isinstance(rewards, list) or not rewards:
            raise ReportError(f"{store.uri_for(key)} line {i}: expected item_id and a non-empty rewards list")
        out[str(row["item_id"])] = float(sum(float(r) for r in rewards) / len(rewards))
    return out


def load_compare_runs(
    args: Sequence[str], runs: Sequence[str] = (), by: Sequence[str] = (), opener: StoreOpener = open_for_reading
) -> list[CompareRun]:
    """Every run the arguments name (as :func:`load_runs`), with its group and its final point's per-item scores."""
    out = []
    for loaded in load_runs(args, runs, opener):
        rec, series = loaded.records, loaded.series
        spec_wire = rec.spec.to_wire()
        if not rec.spec.condition.searches_harness:  # its proposer never ran: no backend to group it by
            spec_wire["experiment"].pop("harnessSearch", None)
        final = series.final
        try:
            items = {} if final is None else read_item_scores(loaded.store, rec.name, final.phase)
        except StoreError as exc:
            raise ReportError(f"run {rec.name} in {loaded.store.uri}: {exc}") from None
        out.append(
            CompareRun(
                label=series.label,
                group=group_name(series.condition, spec_wire, by),
                condition=series.condition,
                seed=rec.spec.experiment.seed
                if rec.spec.experiment.seed is not None
                else rec.spec.experiment.rsft.seed,
                series=series,
                items=items,
            )
        )
    return out
