"""`whale`: the command line. A shell over the library: validate, plan, run, status, report, replay, crd.

Starts fast (no torch, kopf or vllm imports here); heavy modules load inside the commands that
need them.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from whale import domains, layout
from whale.manifest import Manifest, ManifestError, load_manifest
from whale.report.cli import report as report_command
from whale.schedule import ScheduleError, plan as make_plan, resolve

app = typer.Typer(
    name="whale",
    help="WHALE: alternate RSFT weight phases and Meta-Harness harness phases, locally or on Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_STORE = ".whale/store"
FileArg = Annotated[Path, typer.Argument(help="a WhaleRun manifest (YAML), the file `kubectl apply` takes")]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="table | json")]


def _fail(problems: list[str], source: str) -> None:
    err.print(f"[bold red]{escape(source)}: {len(problems)} problem(s)[/]")
    for p in problems:
        err.print(f"  - {p}", markup=False, highlight=False)
    raise typer.Exit(code=1)


def _split_sizes(m: Manifest) -> dict[str, int]:
    domain = domains.load(m.spec.domain)
    return dict(domain.split_sizes(m.spec.data))


def _load_checked(path: Path) -> tuple[Manifest, dict[str, int]]:
    """Parse + validate the manifest and its schedule against the domain's data; exit 1 on problems."""
    try:
        m = load_manifest(path)
    except ManifestError as exc:
        _fail(exc.problems, exc.source)
    try:
        sizes = _split_sizes(m)
        resolve(m.spec, sizes)
    except ScheduleError as exc:
        _fail([str(exc)], str(path))
    except (domains.DomainLoadError, OSError, ValueError) as exc:
        _fail([f"spec.data: cannot read the {m.spec.domain} data: {exc}"], str(path))
    return m, sizes


@app.command()
def validate(file: FileArg) -> None:
    """Check a manifest: exit 0 with a one-line summary, or exit 1 listing every problem."""
    m, sizes = _load_checked(file)
    p = make_plan(m.spec, sizes)
    spec = m.spec
    bits = [f"{p['stepsPerEpoch']} steps/epoch"]
    if spec.condition.trains_weights:
        bits.append(f"{p['totalSteps']} steps")
    if "weightStepsPerCycle" in p:
        bits.append(f"E={p['weightStepsPerCycle']}")
    n_phases = p["counts"]["weight"] + p["counts"]["harness"]
    bound = "<= " if p.get("rolloutsUpperBound") else ""
    console.print(
        f"ok: WhaleRun {m.name} ({spec.domain}, {spec.condition.value}): {', '.join(bits)}; "
        f"{n_phases} phases, {bound}{p['rollouts']} rollouts",
        highlight=False,
    )
    for ignored in m.ignored:
        console.print(f"note: {ignored} ignored by `whale run` (kubectl apply applies it)", markup=False,
                      highlight=False)


@app.command()
def plan(file: FileArg, output: OutputOpt = "table") -> None:
    """The schedule the run will follow: phases, step ranges, iteration bounds and rollouts."""
    m, sizes = _load_checked(file)
    p = make_plan(m.spec, sizes)
    if output == "json":
        typer.echo(json.dumps(p, indent=2))
        return
    table = Table(title=f"{m.name}: {m.spec.condition.value} on {m.spec.domain}")
    for col in ("cycle", "kind", "range / iterations", "note"):
        table.add_column(col)
    omitted = p.get("phasesOmitted", 0)
    for row, ph in enumerate(p["phases"]):
        if omitted and row == len(p["phases"]) // 2:
            table.add_row("...", f"{omitted} more", "", "")
        if ph["kind"] == "weight":
            what = f"steps {ph['fromStep']} -> {ph['toStep']}"
            note = f"ends by patience, >= {ph['minSteps']} steps" if ph.get("upperBound") else ""
        elif ph["kind"] == "harness":
            what = f"{ph['iterations']} iterations"
            note = f"ends by patience, >= {ph['minIterations']}" if ph.get("upperBound") else ""
        else:
            what, note = f"at step {ph['step']}", f"after {ph['after']}"
        table.add_row(str(ph["cycle"]), ph["kind"], what, note)
    console.print(table)
    bound = "at most " if p.get("rolloutsUpperBound") else ""
    counts = p["counts"]
    console.print(f"steps/epoch {p['stepsPerEpoch']}, total steps {p['totalSteps']}, {bound}{p['rollouts']} rollouts; "
                  f"{counts['weight']} weight, {counts['harness']} harness and {counts['eval']} eval phases",
                  highlight=False)
    updates = p.get("optimizerUpdatesPerStep")
    if updates:
        typical = ", ".join(f"{u['updates']} at {u['kept']} kept" for u in updates["byKept"])
        console.print(f"optimizer updates per RSFT step ({updates['miniBatchScope']} mini-batch, "
                      f"{updates['dataParallelRanks']} data-parallel ranks): {updates['formula']}; "
                      f"at most {updates['upperBound']} (every rollout kept); {typical}", highlight=False)


def _open_store(uri: str | None, m: Manifest | None = None) -> Any:
    from whale.store import open_store

    spec_storage = m.spec.storage if m else None
    uri = uri or (spec_storage.uri if spec_storage and spec_storage.uri else None) or os.environ.get(
        "WHALE_STORE", DEFAULT_STORE)
    options: dict[str, Any] = {}
    if uri.startswith("s3://") and spec_storage is not None:
        if spec_storage.endpoint:
            options["endpoint"] = spec_storage.endpoint
        options["secure"] = spec_storage.secure
        if spec_storage.region:
            options["region"] = spec_storage.region
    return open_store(uri, **options)


def storage_env(m: Manifest) -> dict[str, str]:
    """What a workload subprocess needs to open the same S3 store (credentials come from our env)."""
    s = m.spec.storage
    env = {}
    if s.endpoint:
        env["WHALE_S3_ENDPOINT"] = s.endpoint
        env["WHALE_S3_SECURE"] = "true" if s.secure else "false"
    if s.region:
        env["WHALE_S3_REGION"] = s.region
    return env


@app.command()
def run(
    file: FileArg,
    store: Annotated[Optional[str], typer.Option(help="DIR or s3://bucket/prefix (default: spec.storage.uri, "
                                                     "$WHALE_STORE, or ./.whale/store)")] = None,
    workdir: Annotated[Optional[Path], typer.Option(help="scratch folder for logs and caches")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="give up after this many seconds (resumable)")] = None,
    retry: Annotated[bool, typer.Option("--retry", help="resume a Failed run from its last good state: completed "
                                                       "phases kept, the failed phase started afresh")] = False,
) -> None:
    """Run the manifest on this machine; Ctrl-C (or SIGTERM) and run again to resume where it stopped."""
    from whale.runner.local import (
        LocalRunner,
        RunConflictError,
        RunInterrupted,
        interrupt_on_signals,
        status_summary,
    )
    from whale.store import StoreError

    m, sizes = _load_checked(file)
    try:
        st = _open_store(store, m)
        st.check()  # a wrong endpoint or key, or a read-only folder, fails here, before any work is done
    except StoreError as exc:
        _fail([f"--store: {exc}"], str(file))
    work = workdir or Path(".whale") / "work" / m.name
    env = storage_env(m)
    last: dict[str, Any] = {}

    def show(status, previous, decision) -> None:
        summary = status_summary(status)
        keys = ("phase", "activePhase", "cycle", "step", "iteration", "best", "reward", "harnessScore", "emptySteps")
        now = {k: summary[k] for k in keys}
        if now != last:
            last.update(now)
            bits = [f"[bold]{summary['phase']}[/]", f"cycle {summary['cycle']}",
                    f"{summary['activePhase'] or summary['stage'] or '-'}",
                    f"step {summary['step']}/{summary['totalSteps']}"]
            if status.stage and status.stage.value == "harness":
                bits.append(f"iteration {summary['iteration']}")
                if summary["harnessScore"] is not None:
                    bits.append(f"harness score {summary['harnessScore']:.3f}")
            elif summary["reward"] is not None:
                bits.append(f"reward {summary['reward']:.3f}")
            bits.append(f"best {summary['best'] or '-'}")
            bits.append(f"rollouts {summary['rolloutsSpent']}")
            if status.empty_steps:  # RSFT steps that trained nothing: the run may be wasting its budget
                bits.append(f"[yellow]warning: {status.empty_steps} step(s) kept no trajectory "
                            f"(last: step {status.last_empty_step})[/]")
            console.print(" | ".join(bits), highlight=False)

    extra: dict[str, Any] = {}
    if os.environ.get("WHALE_WORKLOAD_COMMAND"):  # e.g. wrap workloads in a profiler, or a test double
        extra["workload_command"] = tuple(shlex.split(os.environ["WHALE_WORKLOAD_COMMAND"]))
    hint = " ".join(["whale", "run", shlex.quote(str(file)), *(["--store", shlex.quote(store)] if store else [])])
    runner = LocalRunner(name=m.name, spec=m.spec, store=st, split_sizes=sizes, workdir=work, env=env,
                         on_status=show, resume_hint=hint, **extra)
    console.print(f"run {m.name}: store {st.uri}", highlight=False)
    try:
        with interrupt_on_signals():
            status = runner.run(max_seconds=timeout, retry=retry)
    except RunConflictError as exc:
        _fail([str(exc)], str(file))
    except RunInterrupted as exc:
        err.print(f"stopped by {exc}; the status is saved: run `{hint}` to resume", highlight=False)
        raise typer.Exit(code=128 + exc.signum) from None
    except KeyboardInterrupt:
        err.print(f"interrupted; the status is saved: run `{hint}` to resume", highlight=False)
        raise typer.Exit(code=130) from None
    except (StoreError, TimeoutError) as exc:
        _fail([str(exc)], str(file))
    console.print(json.dumps(status_summary(status), indent=2), highlight=False)
    if status.phase.value == "Failed":
        if not retry:
            err.print(f"run {m.name} failed; fix the cause, then `{hint} --retry` resumes it from its last good state",
                      highlight=False)
        raise typer.Exit(code=1)


def _runner_line(st: Any, name: str, phase: str) -> str:
    """Who runs the run now, from its lock: what `whale status` shows beside the status."""
    from whale.store import StoreError

    try:
        info = st.read_lease(layout.lock_key(name))
    except StoreError as exc:
        return f"unknown (cannot read the run lock: {exc})"
    if info is not None and info.live:
        return info.describe()
    if phase in ("Pending", "Running"):
        return "none: the run is not running now; `whale run FILE` resumes it"
    return "none"


@app.command()
def status(
    name: Annotated[str, typer.Argument(help="the run's metadata.name")],
    store: Annotated[Optional[str], typer.Option(help="DIR or s3://bucket/prefix")] = None,
    output: OutputOpt = "table",
) -> None:
    """Show a run's status from the store, and which process runs it now."""
    from whale.runner.local import status_summary
    from whale.spec import WhaleRunStatus
    from whale.store import StoreError

    try:
        layout.check_run_name(name)
        st = _open_store(store)
        raw = st.read_json_or_none(layout.status_key(name))
    except (ValueError, StoreError) as exc:
        _fail([str(exc)], "status")
    if raw is None:
        _fail([f"no run named {name!r} in the store (did `whale run` start it with this --store?)"], "status")
    run_status = WhaleRunStatus.model_validate(raw)
    if output == "json":
        typer.echo(json.dumps(run_status.to_wire(), indent=2))
        return
    table = Table(title=f"WhaleRun {name}", show_header=False)
    for k, v in status_summary(run_status).items():
        table.add_row(k, "-" if v is None else str(v))
    table.add_row("runner", _runner_line(st, name, run_status.phase.value))
    console.print(table)
    if run_status.evals:
        evals = Table(title="evaluations")
        for col in ("phase", "step", "harness", "mean@k", "rollouts at"):
            evals.add_column(col)
        for e in run_status.evals:
            evals.add_row(e.phase, str(e.step), e.harness or "h0",
                          "-" if e.mean_at_k is None else f"{e.mean_at_k:.4f}", str(e.rollouts_at))
        console.print(evals)


@app.command()
def crd(
    check: Annotated[Optional[Path], typer.Option(help="exit 1 when this file differs from the generated CRD")] = None,
) -> None:
    """Print the WhaleRun CRD generated from the spec model."""
    from whale.crd import render

    text = render()
    if check is not None:
        if not check.exists() or check.read_text() != text:
            _fail([f"{check} is not what `whale crd` generates; run `whale crd > {check}`"], "crd")
        console.print(f"ok: {check} is up to date")
        return
    typer.echo(text, nl=False)


@app.command()
def replay(
    domain: Annotated[str, typer.Argument(help="a registered domain")],
    item: Annotated[Path, typer.Option(help="one item in the domain's raw row format (JSON)")],
    replies: Annotated[Optional[list[str]], typer.Argument(help="the model's replies, in order (after --)")] = None,
    harness: Annotated[Optional[Path], typer.Option(help="a harness file (default: the domain's h0)")] = None,
) -> None:
    """Run one episode whose model replies are given; print it as JSON (reward, turns, trace)."""
    try:
        raw = json.loads(item.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        _fail([f"--item: cannot read {item} as JSON: {exc}"], "replay")
    if domain not in domains.available():
        _fail([f"unknown domain {domain!r}; registered: {', '.join(domains.available())}"], "replay")
    from whale.replay import replay as run_replay

    try:
        episode = run_replay(domain, raw, list(replies or []), harness)
    except (ValueError, KeyError, OSError) as exc:
        _fail([str(exc)], "replay")
    typer.echo(json.dumps(episode, indent=2, default=str))


@app.command("domains")
def list_domains() -> None:
    """List the registered domains."""
    for name in domains.available():
        typer.echo(name)


app.command("report")(report_command)  # whale/report/cli.py


def main() -> None:
    app()


if __name__ == "__main__":
    main()
