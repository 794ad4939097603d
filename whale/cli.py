"""`whale`: the command line. A shell over the library: validate, plan, prepare, run, list, status, logs, stop,
delete, report, compare, replay, crd, migrate, domains.

Starts fast (no torch, kopf or vllm imports here); heavy modules load inside the commands that
need them. What the commands show is computed in :mod:`whale.console`; the functions here parse
arguments, call it, and turn failures into a message naming the field or option and exit 1.

Exit codes of `whale run`: 0 the run ended (or was already done), 1 it failed or could not start,
3 `whale stop` stopped it (resumable), 124 its --timeout passed (resumable), 130 Ctrl-C, 128+N signal N
(both resumable).
"""

from __future__ import annotations

import enum
import json
import os
import shlex
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import typer.core
from rich import box
from rich.markup import escape
from rich.table import Table

import whale
from whale import plugins
from whale.console.streams import cli_console, invoked_as
from whale.core import layout
from whale.core.convert import V1ALPHA1, V1ALPHA2
from whale.core.schedule import ScheduleError, resolve
from whale.core.schedule import plan as make_plan
from whale.manifest import (
    Manifest,
    ManifestError,
    architecture_problems,
    format_validation_error,
    hub_model,
    load_manifest,
    local_problems,
    spec_warnings,
)
from whale.report.cli import report as report_command
from whale.report.compare_cli import compare as compare_command

app = typer.Typer(
    name="whale",
    help="WHALE: alternate RSFT weight phases and Meta-Harness harness phases, locally or on Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = cli_console()
err = cli_console(stderr=True)


def _hide_flag_types() -> None:
    """typer's rich help labels every flag `<bool>` (0.2x): a flag takes no value, so -h shows none."""
    original = getattr(typer.core.TyperOption, "display_type_rich", None)
    if original is None:
        return
    show: Callable[[typer.core.TyperOption, Any], str | None] = original

    def no_type_for_flags(self: typer.core.TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else show(self, ctx)

    setattr(typer.core.TyperOption, "display_type_rich", no_type_for_flags)  # noqa: B010


_hide_flag_types()

DEFAULT_STORE = ".whale/store"
#: `whale run` was stopped by `whale stop` (resumable)
EXIT_STOPPED = 3
#: `whale run --timeout` passed before the run ended (resumable); 124 as coreutils' `timeout`
EXIT_TIMEOUT = 124


class Output(str, enum.Enum):
    table = "table"
    json = "json"


class Target(str, enum.Enum):
    auto = "auto"
    local = "local"
    cluster = "cluster"


FileArg = Annotated[Path, typer.Argument(help="a WhaleRun manifest (YAML), the file `kubectl apply` takes")]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table | json")]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help=f"DIR or s3://bucket/prefix (default: $WHALE_STORE, or ./{DEFAULT_STORE}); S3 settings from "
        "WHALE_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY",
    ),
]
NameArg = Annotated[str, typer.Argument(help="the run's metadata.name")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"whale {whale.version()}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """WHALE: alternate RSFT weight phases and Meta-Harness harness phases, locally or on Kubernetes."""


def _fail(problems: list[str], source: str) -> NoReturn:
    err.print(f"[bold red]{escape(source)}: {len(problems)} problem(s)[/]")
    for p in problems:
        err.print(f"  - {p}", markup=False, highlight=False)
    raise typer.Exit(code=1)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _split_sizes(m: Manifest) -> dict[str, int]:
    from whale.domain import for_run

    domain = for_run(plugins.load(m.spec.domain), m.spec.experiment.domain_options)
    return dict(domain.split_sizes(m.spec.experiment.data))


def _cluster_warnings(m: Manifest, source: str) -> list[str]:
    """The spec's ``cluster`` section checked by the operator's model (the core keeps it opaque: whale.core.spec):
    a problem exits 1 naming ``spec.cluster.<field>``; what may not do what it seems to comes back as warnings."""
    from pydantic import ValidationError

    from whale_operator.cluster_spec import ClusterRunSpec, cluster_warnings

    try:
        placed = ClusterRunSpec.of(m.spec)
    except ValidationError as exc:
        _fail(format_validation_error(exc), source)
    return cluster_warnings(placed)


def _load_checked(path: Path) -> tuple[Manifest, dict[str, int]]:
    """Parse + validate the manifest and its schedule against the domain's data; exit 1 on problems."""
    try:
        m = load_manifest(path)
    except ManifestError as exc:
        _fail(exc.problems, exc.source)
    if m.converted_from:  # on stderr: `whale plan -o json` stays JSON
        err.print(
            f"note: {path} is {m.converted_from}, read as {V1ALPHA2}; `whale migrate {path}` rewrites it",
            markup=False,
            highlight=False,
        )
    for notice in m.notices:
        err.print(f"note: {path}: {notice} (`whale migrate {path}` does)", markup=False, highlight=False)
    placement_warnings = _cluster_warnings(m, str(path))
    try:
        sizes = _split_sizes(m)
        resolve(m.spec, sizes)
    except ScheduleError as exc:
        _fail([str(exc)], str(path))
    except (plugins.DomainLoadError, OSError, ValueError) as exc:
        where = (
            "spec.experiment.data.dataDir"
            if m.spec.experiment.data.data_dir or os.environ.get("WHALE_DATA_DIR")
            else "spec.experiment.data"
        )
        _fail([f"{where}: cannot read the {m.spec.domain} data: {exc}"], str(path))
    for warning in placement_warnings + spec_warnings(m.spec, sizes):  # on stderr: `whale plan -o json` stays JSON
        err.print(f"warning: {warning}", markup=False, highlight=False)
    return m, sizes


def _is_local(m: Manifest, target: Target) -> bool:
    """`whale validate --target auto`: a manifest with a namespace is meant for `kubectl apply`."""
    return target is Target.local or (target is Target.auto and m.namespace is None)


@app.command()
def validate(
    file: FileArg,
    target: Annotated[
        Target,
        typer.Option(
            help="local: check what `whale run` needs here too (model folder, replay script, data root); cluster: "
            "report those as notes (the paths are the image's); auto: cluster when metadata.namespace is set"
        ),
    ] = Target.auto,
) -> None:
    """Check a manifest: exit 0 with a one-line summary, or exit 1 listing every problem."""
    m, sizes = _load_checked(file)
    local = _is_local(m, target)
    here = local_problems(m, hub_check=local)
    refused, arch_notes = architecture_problems(m.spec, Path.cwd(), os.environ)
    if refused or (here and local):
        _fail(refused + (here if local else []), str(file))
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
        console.print(
            f"note: {ignored} ignored by `whale run` (kubectl apply applies it)", markup=False, highlight=False
        )
    for problem in here:  # only when checked for a cluster
        console.print(
            f"note: not on this machine, so `whale run` would refuse it here: {problem}", markup=False, highlight=False
        )
    location = hub_model(m.spec, Path.cwd(), os.environ) if local else None
    if location is not None:  # where the Hugging Face model loads from (a problem has failed above)
        console.print(f"note: {location.note()}", markup=False, highlight=False)
    for note in arch_notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def plan_with_cost(m: Manifest, sizes: dict[str, int], assumptions: Any = None) -> tuple[dict[str, Any], Any]:
    """`whale plan`'s JSON (the schedule, rollouts, and ``cost``) and the cost estimate (None when the
    model's size is unknown: ``cost`` then holds the reason)."""
    from whale.console.plan import with_costs
    from whale.cost import Assumptions, CostError, estimate

    p = with_costs(make_plan(m.spec, sizes), m.spec, sizes)
    try:
        est = estimate(p, m.spec, assumptions or Assumptions())
    except CostError as exc:
        p["cost"] = {"error": str(exc)}
        return p, None
    p["cost"] = est.to_wire()
    return p, est


@app.command()
def plan(
    file: FileArg,
    output: OutputOpt = Output.table,
    parameters: Annotated[
        float | None,
        typer.Option(
            min=1e5,
            max=1e13,
            help="model parameters for the cost (default: what spec.experiment.model.name states, e.g. 2B)",
        ),
    ] = None,
    tokens_per_episode: Annotated[
        int | None,
        typer.Option(
            min=1, max=10_000_000, help="typical generated tokens per episode (default: the spec's cap, an upper bound)"
        ),
    ] = None,
    prompt_tokens: Annotated[
        int, typer.Option(min=0, max=10_000_000, help="prompt tokens trained per kept rollout")
    ] = 512,
    acceptance: Annotated[
        float, typer.Option(min=0.001, max=1.0, help="fraction of rollouts kept for SFT (default 1: an upper bound)")
    ] = 1.0,
    proposer_seconds: Annotated[
        float | None,
        typer.Option(
            min=0, max=1e7, help="wall seconds of one proposer iteration (default: its timeoutSeconds, an upper bound)"
        ),
    ] = None,
) -> None:
    """The schedule the run will follow: phases, rollouts, evaluation cost, GPU-hours (docs/performance.md)."""
    from whale.console.cost_table import cost_lines
    from whale.cost import Assumptions

    m, sizes = _load_checked(file)
    p, est = plan_with_cost(
        m,
        sizes,
        Assumptions(
            parameters=parameters,
            tokens_per_episode=tokens_per_episode,
            prompt_tokens=prompt_tokens,
            acceptance=acceptance,
            proposer_seconds=proposer_seconds,
        ),
    )
    if output is Output.json:
        typer.echo(json.dumps(p, indent=2))
        return
    table = Table(title=f"{m.name}: {m.spec.condition.value} on {m.spec.domain}")
    for col, justify in (
        ("cycle", "right"),
        ("kind", "left"),
        ("range / iterations", "left"),
        ("rollouts", "right"),
        ("note", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]  # rich's Literal; these are its values
    omitted = p.get("phasesOmitted", 0)
    for row, ph in enumerate(p["phases"]):
        if omitted and row == len(p["phases"]) // 2:
            table.add_row("...", f"{omitted} more", "", "", "")
        bound = ""
        if ph["kind"] == "weight":
            what = f"steps {ph['fromStep']} -> {ph['toStep']}"
            note = f"ends by patience, >= {ph['minSteps']} steps" if ph.get("upperBound") else ""
        elif ph["kind"] == "harness":
            what = f"{ph['iterations']} iterations: the incoming evaluation + {ph['proposerIterations']} proposer"
            note = f"ends by patience, >= {ph['minIterations']}" if ph.get("upperBound") else ""
        elif ph.get("iteration") is not None:
            what = f"at step {ph['step']}"
            note = f"harness accepted at iteration {ph['iteration']}, if it changed there"
        else:
            what, note = f"at step {ph['step']}", f"after {ph['after']}"
        bound = "<= " if ph.get("upperBound") else ""
        table.add_row(str(ph["cycle"]), ph["kind"], what, f"{bound}{ph['rollouts']:,}", note)
    console.print(table)
    bound = "at most " if p.get("rolloutsUpperBound") else ""
    eval_bound = "at most " if p.get("evaluationsUpperBound") else ""
    counts = p["counts"]
    console.print(
        f"steps/epoch {p['stepsPerEpoch']}, total steps {p['totalSteps']}, {bound}{p['rollouts']:,} "
        f"training rollouts (weight steps and harness search); {counts['weight']} weight, "
        f"{counts['harness']} harness and {eval_bound}{counts['eval']} eval phases",
        highlight=False,
    )
    ev = p["evaluation"]
    console.print(
        f"evaluation: {ev['count']} point(s) x {ev['items']} items x {ev['samplesPerItem']} samples = "
        f"{ev['rolloutsEach']:,} rollouts each, {ev['rollouts']:,} in all (not in the training budget)",
        highlight=False,
    )
    updates = p.get("optimizerUpdatesPerStep")
    if updates:
        typical = ", ".join(f"{u['updates']} at {u['kept']} kept" for u in updates["byKept"])
        console.print(
            f"optimizer updates per RSFT step ({updates['miniBatchScope']} mini-batch, "
            f"{updates['dataParallelRanks']} data-parallel ranks): {updates['formula']}; "
            f"at most {updates['upperBound']} (every rollout kept); {typical}"
            + (
                ""
                if updates["exact"]
                else " (at least: rsft.sequences: turn may train a trajectory as several sequences)"
            ),
            highlight=False,
        )
    if est is None:
        console.print(f"cost: not estimated: {p['cost']['error']}", markup=False, highlight=False)
    else:
        for line in cost_lines(est):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _store_uri(uri: str | None, m: Manifest | None = None) -> str:
    spec_storage = m.spec.execution.storage if m else None
    return (
        uri
        or (spec_storage.uri if spec_storage and spec_storage.uri else None)
        or os.environ.get("WHALE_STORE", DEFAULT_STORE)
    )


def _open_store(uri: str | None, m: Manifest | None = None) -> Any:
    """The store, with the manifest's connection settings when there is one (else the environment's)."""
    from whale.control.storage import open_spec_store
    from whale.store import open_store

    target = _store_uri(uri, m)
    return open_spec_store(m.spec.execution.storage, target) if m else open_store(target)


def _open_existing_store(uri: str | None, command: str) -> tuple[Any, str]:
    """(store, the store as the person named it) for a command that reads runs: a folder that does not exist
    is an error (opening it would create it), as is an S3 store that cannot be reached."""
    from whale.store import StoreError

    text = _store_uri(uri)
    if "://" not in text or text.startswith("file://"):
        path = Path(text.removeprefix("file://")).expanduser()
        if not path.is_dir():
            _fail(
                [f"--store: no store at {path} (give --store DIR or s3://bucket/prefix, or set $WHALE_STORE)"], command
            )
    try:
        st = _open_store(text)
        if text.startswith("s3://"):
            st.check()  # reachable, with these credentials (a folder is only read: it need not be writable)
    except StoreError as exc:
        _fail([f"--store: {exc}"], command)
    return st, text


def storage_env(m: Manifest) -> dict[str, str]:
    """What a workload subprocess needs to open the same S3 store (credentials come from our env)."""
    s = m.spec.execution.storage
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
    store: Annotated[
        str | None,
        typer.Option(
            help="DIR or s3://bucket/prefix (default: spec.execution.storage.uri, $WHALE_STORE, or ./.whale/store)"
        ),
    ] = None,
    workdir: Annotated[Path | None, typer.Option(help="scratch folder for logs and caches")] = None,
    timeout: Annotated[float | None, typer.Option(help="give up after this many seconds (exit 124; resumable)")] = None,
    retry: Annotated[
        bool,
        typer.Option(
            "--retry",
            help="resume a Failed run from its last good state: completed phases kept, the failed phase started afresh",
        ),
    ] = False,
    output: Annotated[
        Output,
        typer.Option(
            "--output",
            "-o",
            help="table: live progress, then the evaluation table and the next commands; json: "
            "timestamped progress lines on stderr, the status summary as JSON on stdout",
        ),
    ] = Output.table,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            "-d",
            help="run in the background (its output to WORKDIR/runner.log); follow it with `whale logs NAME -f`, "
            "`whale status NAME`, end it with `whale stop NAME`",
        ),
    ] = False,
) -> None:
    """Run the manifest on this machine, with live progress; run it again to resume.

    Ctrl-C, SIGTERM, --timeout or `whale stop NAME` stop every workload and save the status; the same
    command resumes where it stopped. Live progress on a terminal, timestamped lines otherwise; at the
    end, the evaluation table, the accepted harness and the next commands."""
    from whale.console.display import RunDisplay
    from whale.console.progress import RunWork, duration
    from whale.console.summary import final_summary
    from whale.runner.local import (
        LocalRunner,
        RunConflictError,
        RunInterrupted,
        RunStopped,
        RunTimeout,
        interrupt_on_signals,
        status_summary,
    )
    from whale.store import StoreError

    m, sizes = _load_checked(file)
    from whale.metaharness.proposer import environment_problems

    # what `whale validate` checks, and the proposer's key variable: refused before any phase starts
    problems = local_problems(m) + architecture_problems(m.spec, Path.cwd(), os.environ)[0]
    problems += [str(p) for p in environment_problems(m.spec)]
    if problems:
        _fail(problems, str(file))
    try:
        st = _open_store(store, m)
        st.check()  # a wrong endpoint or key, or a read-only folder, fails here, before any work is done
    except StoreError as exc:
        _fail([f"--store: {exc}"], str(file))
    work = workdir or Path(".whale") / "work" / m.name
    if detach:
        _detach(file, m.name, st, store, work, timeout, retry)
        return
    env = storage_env(m)
    extra: dict[str, Any] = {}
    if os.environ.get("WHALE_WORKLOAD_COMMAND"):  # e.g. wrap workloads in a profiler, or a test double
        extra["workload_command"] = tuple(shlex.split(os.environ["WHALE_WORKLOAD_COMMAND"]))
    prog = invoked_as()
    hint = " ".join([prog, "run", shlex.quote(str(file)), *(["--store", shlex.quote(store)] if store else [])])
    started = time.monotonic()
    # -o json: the progress lines go to stderr, so stdout is the JSON alone
    planned = RunWork.from_plan(make_plan(m.spec, sizes))  # the run ETA counts every phase of the plan
    display = (
        RunDisplay(m.name, console, live=None, work=planned)
        if output is Output.table
        else RunDisplay(m.name, err, live=False, work=planned)
    )
    runner = LocalRunner(
        name=m.name,
        spec=m.spec,
        store=st,
        split_sizes=sizes,
        workdir=work,
        env=env,
        on_view=display,
        resume_hint=hint,
        **extra,
    )
    display.console.print(f"run {m.name}: store {st.uri}", highlight=False, markup=False)
    try:
        with interrupt_on_signals(), display:
            status = runner.run(max_seconds=timeout, retry=retry)
    except RunConflictError as exc:
        _fail([str(exc)], str(file))
    except RunStopped as exc:
        err.print(f"{exc}; the status is saved: run `{hint}` to resume", highlight=False, markup=False)
        raise typer.Exit(code=EXIT_STOPPED) from None
    except RunTimeout as exc:
        err.print(str(exc), highlight=False, markup=False)
        raise typer.Exit(code=EXIT_TIMEOUT) from None
    except RunInterrupted as exc:
        err.print(f"stopped by {exc}; the status is saved: run `{hint}` to resume", highlight=False, markup=False)
        raise typer.Exit(code=128 + exc.signum) from None
    except KeyboardInterrupt:
        err.print(f"interrupted; the status is saved: run `{hint}` to resume", highlight=False, markup=False)
        raise typer.Exit(code=130) from None
    except (StoreError, TimeoutError) as exc:
        _fail([str(exc)], str(file))
    if output is Output.json:
        console.print(json.dumps(status_summary(status), indent=2), highlight=False, markup=False)
    else:
        keys = [k for k in (status.current_harness, status.current_checkpoint) if k]
        store_arg = store or st.uri
        console.print(
            final_summary(
                m.name,
                status,
                {k: st.uri_for(k) for k in keys},
                store_arg,
                hint,
                duration(time.monotonic() - started),
                prog,
            )
        )
    if status.phase.value == "Failed":
        if not retry:
            err.print(
                f"run {m.name} failed; fix the cause, then `{hint} --retry` resumes it from its last good state",
                highlight=False,
                markup=False,
            )
        raise typer.Exit(code=1)


#: seconds `whale run --detach` waits for the background runner to hold the run lock
DETACH_START_S = 60.0


def _detach(file: Path, name: str, st: Any, store: str | None, work: Path, timeout: float | None, retry: bool) -> None:
    """Start this `whale run` again in the background, in its own session (a closed terminal does not end it),
    its output to ``work/runner.log``; return once it holds the run lock (or exit 1 with its output's end)."""
    import subprocess
    import sys

    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "runner.log"
    argv = [sys.executable, "-m", "whale.cli", "run", str(file), "--workdir", str(work)]
    argv += ["--store", store] if store else []
    argv += ["--timeout", f"{timeout:g}"] if timeout is not None else []
    argv += ["--retry"] if retry else []
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + DETACH_START_S
    while True:
        lock = st.read_lease(layout.lock_key(name))
        if lock is not None and lock.live and lock.holder is not None and lock.holder.pid == proc.pid:
            break
        code = proc.poll()
        if code is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace").splitlines()[-5:]
            why = (
                f"exited with {code}" if code is not None else f"did not take the run lock within {DETACH_START_S:g} s"
            )
            if code == 0:
                console.print(f"run {name} had nothing left to do; {log_path}:", highlight=False, markup=False)
                for line in tail:
                    console.print(f"  {line}", highlight=False, markup=False)
                return
            _fail([f"the background runner {why}; the end of {log_path}:", *tail], str(file))
        time.sleep(0.1)
    prog = invoked_as()
    where = f" --store {shlex.quote(store)}" if store else ""
    console.print(
        f"run {name} runs in the background (pid {proc.pid}); its output: {log_path}\n"
        f"  {prog} logs {name}{where} -f\n  {prog} status {name}{where}\n  {prog} stop {name}{where}",
        highlight=False,
        markup=False,
    )


def _runner_line(st: Any, name: str, phase: str) -> str:
    """Who runs the run now, from its lock: what `whale status` shows beside the status."""
    from whale.store import StoreError

    try:
        info = st.read_lease(layout.lock_key(name))
    except StoreError as exc:
        return f"unknown (cannot read the run lock: {exc})"
    if info is not None and info.live:
        return info.describe()
    if phase in ("Pending", "Running", "Interrupted"):
        return "none: the run is not running now; `whale run FILE` resumes it"
    return "none"


def _require_run(st: Any, name: str, command: str) -> None:
    """Exit 1 naming the store searched and the runs it holds when it has no run ``name``."""
    from whale.console.runs import run_names

    try:
        layout.check_run_name(name)
    except ValueError as exc:
        _fail([str(exc)], command)
    if st.exists(layout.spec_key(name)) or st.exists(layout.status_key(name)):
        return
    names = run_names(st)
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    _fail(
        [
            f"no run named {name!r} in the store {st.uri}; "
            + (f"runs there: {shown}" if names else "it holds no runs")
            + " (give --store, or set $WHALE_STORE, for another store; `whale list` lists a store's runs)"
        ],
        command,
    )


@app.command()
def status(
    name: NameArg,
    store: StoreOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Show a run's status from the store, and which process runs it now."""
    from whale.core.status import WhaleRunStatus
    from whale.runner.local import status_summary
    from whale.store import StoreError

    st, _ = _open_existing_store(store, "status")
    try:
        _require_run(st, name, "status")
        raw = st.read_json_or_none(layout.status_key(name))
    except StoreError as exc:
        _fail([str(exc)], "status")
    run_status = WhaleRunStatus.model_validate(raw or {})
    if output is Output.json:
        typer.echo(json.dumps(run_status.to_wire(), indent=2))
        return
    table = Table(title=f"WhaleRun {name} ({st.uri})", show_header=False)
    for k, v in status_summary(run_status).items():
        table.add_row(k, "-" if v is None else str(v))
    table.add_row("runner", _runner_line(st, name, run_status.phase.value))
    console.print(table)
    if run_status.evals:
        from whale.console.summary import evaluation_table

        console.print(evaluation_table(run_status))


@app.command("list")
def list_runs(store: StoreOpt = None, output: OutputOpt = Output.table) -> None:
    """The runs of a store: phase, what runs now, best, rollouts, age, disk use, runner."""
    from whale.console.runs import run_rows, size_words
    from whale.store import StoreError

    st, _ = _open_existing_store(store, "list")
    try:
        rows, more = run_rows(st, datetime.now(UTC))
    except StoreError as exc:
        _fail([str(exc)], "list")
    if output is Output.json:
        typer.echo(json.dumps({"store": st.uri, "runs": [r.to_wire() for r in rows], "notListed": more}, indent=2))
        return
    if not rows:
        console.print(f"no runs in {st.uri}", highlight=False, markup=False)
        return
    table = Table(title=f"runs in {st.uri}", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("name", "phase", "now", "best", "rollouts", "age", "disk", "runner"):
        table.add_column(
            col,
            justify="right" if col in ("rollouts", "age", "disk") else "left",
            no_wrap=col in ("name", "phase", "best", "rollouts", "age", "disk"),
            min_width=6,
        )
    for r in rows:
        rollouts = "-" if r.rollouts is None else f"{r.rollouts:,}"
        table.add_row(r.name, r.phase, r.now, r.best, rollouts, r.age, size_words(r.disk_bytes), r.runner)
    console.print(table)
    if more:
        console.print(f"... and {more} more runs not listed", highlight=False)


@app.command()
def logs(
    name: NameArg,
    phase: Annotated[
        str | None,
        typer.Option(
            help="this phase's log (e.g. c01-weight, eval-c00-s000000-start); "
            "default: the phase running now, or the last one"
        ),
    ] = None,
    attempt: Annotated[int | None, typer.Option(min=1, help="this attempt of the phase (default: the latest)")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="keep printing as it is written: the phase until it ends; without --phase, the run until it stops",
        ),
    ] = False,
    tail: Annotated[int | None, typer.Option(min=0, help="only the last N lines (then follow, with -f)")] = None,
    store: StoreOpt = None,
) -> None:
    """A run's workload output, live (-f follows it).

    Read from the log file itself on the machine that runs the run, else from the copy the runner keeps
    in the store (renewed every few seconds)."""
    from whale.console.logs import LogsError, find_target, show
    from whale.store import StoreError

    st, _ = _open_existing_store(store, "logs")
    try:
        _require_run(st, name, "logs")
        target = find_target(st, name, phase, attempt)
        if follow and phase is None:
            typer.echo(target.header(), nl=False)
        show(
            st,
            name,
            target,
            lambda text: typer.echo(text, nl=False),
            follow=follow,
            follow_run=follow and phase is None,
            tail=tail,
        )
    except LogsError as exc:
        _fail([str(exc)], "logs")
    except StoreError as exc:
        _fail([str(exc)], "logs")
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None


@app.command()
def stop(
    name: NameArg,
    store: StoreOpt = None,
    wait: Annotated[bool, typer.Option(help="wait until the runner has stopped and saved the status")] = True,
    timeout: Annotated[float, typer.Option(min=1, help="seconds to wait for it")] = 120.0,
) -> None:
    """Ask the `whale run` running NAME to stop (resumable).

    Its workloads end, the status is saved as interrupted, and `whale run FILE` resumes it. The request
    goes through the store, so it works from any machine that reaches the store."""
    from whale.core.status import WhaleRunStatus
    from whale.runner.control import request_stop
    from whale.store import StoreError

    st, _ = _open_existing_store(store, "stop")
    try:
        _require_run(st, name, "stop")
        info = request_stop(st, name, _now())
    except StoreError as exc:
        _fail([str(exc)], "stop")
    if info is None:
        console.print(
            f"run {name} is not running (no runner holds its lock): nothing to stop", highlight=False, markup=False
        )
        return
    console.print(f"asked the runner of {name} to stop: {info.describe()}", highlight=False, markup=False)
    if not wait:
        return
    deadline = time.monotonic() + timeout
    try:
        while True:
            lock = st.read_lease(layout.lock_key(name))
            if lock is None or not lock.live:
                break
            if time.monotonic() > deadline:
                _fail(
                    [
                        f"the runner still holds {name} after {timeout:g} s (it stops its workloads first, each "
                        "within its grace period); check `whale status` again, or signal the runner's pid"
                    ],
                    "stop",
                )
            time.sleep(0.2)
        raw = st.read_json_or_none(layout.status_key(name))
    except StoreError as exc:
        _fail([str(exc)], "stop")
    saved = WhaleRunStatus.model_validate(raw or {})
    console.print(
        f"stopped: run {name} is {saved.phase.value}; {saved.message or ''}".rstrip("; "), highlight=False, markup=False
    )


@app.command()
def delete(
    name: NameArg,
    store: StoreOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="delete without asking")] = False,
) -> None:
    """Delete a run from its store (everything under runs/NAME/), after confirmation.

    Refused while a `whale run` runs it (`whale stop NAME` first). The domains' prepared data (data/) is shared
    by runs and stays. A deleted run cannot be resumed; `whale run FILE` then starts it afresh."""
    from whale.runner.control import RunBusyError, delete_run, run_keys
    from whale.store import StoreError

    st, _ = _open_existing_store(store, "delete")
    try:
        _require_run(st, name, "delete")
        keys = run_keys(st, name)
    except StoreError as exc:
        _fail([str(exc)], "delete")
    where = st.uri_for(layout.run_prefix(name)) + "/"
    if not yes and not typer.confirm(f"delete run {name}: {len(keys)} objects under {where}?", default=False):
        console.print("nothing deleted", highlight=False, markup=False)
        raise typer.Exit(code=1)
    try:
        deleted = delete_run(st, name, keys)
    except (RunBusyError, StoreError) as exc:
        _fail([str(exc)], "delete")
    console.print(f"deleted run {name}: {deleted} objects under {where}", highlight=False, markup=False)


@app.command()
def crd(
    check: Annotated[Path | None, typer.Option(help="exit 1 when this file differs from the generated CRD")] = None,
) -> None:
    """Print the WhaleRun CRD generated from the spec model."""
    from whale_operator.crd import render

    text = render()
    if check is not None:
        if not check.exists() or check.read_text() != text:
            _fail([f"{check} is not what `whale crd` generates; run `whale crd > {check}`"], "crd")
        console.print(f"ok: {check} is up to date")
        return
    typer.echo(text, nl=False)


@app.command()
def migrate(
    files: Annotated[list[Path], typer.Argument(help="manifests to rewrite in place", exists=True, dir_okay=False)],
    check: Annotated[bool, typer.Option(help="change nothing; exit 1 when a file still needs migrating")] = False,
    from_cluster: Annotated[
        bool,
        typer.Option(
            help="the file is `kubectl get whaleruns -o yaml` output: write objects to `kubectl create`, each "
            "resuming its old store (spec.execution.resumeFrom), without the server's fields"
        ),
    ] = False,
) -> None:
    """Rewrite whale.dev/v1alpha1 manifests as v1alpha2 (comments kept), and a field v1alpha2 moved since
    (cluster.maxEvictions) where it now lives; other files are left as they are."""
    from whale.manifest import read_text
    from whale.migrate import MigrateError, migrate_cluster_dump, migrate_text, write_atomic

    problems, stale = [], []
    for path in files:
        try:
            result = (migrate_cluster_dump if from_cluster else migrate_text)(read_text(path))
        except (ManifestError, MigrateError) as exc:
            problems.append(f"{path}: {exc.problems[0] if isinstance(exc, ManifestError) else exc}")
            continue
        if not result.documents:
            console.print(f"{path}: already {V1ALPHA2}", highlight=False, markup=False)
        elif check:
            stale.append(f"{path}: {V1ALPHA1}, or a field v1alpha2 moved since; run `whale migrate {path}`")
        else:
            write_atomic(path, result.text)
            console.print(f"{path}: migrated to {V1ALPHA2}", highlight=False, markup=False)
    if problems or stale:
        _fail(problems + stale, "migrate")


@app.command()
def replay(
    domain: Annotated[str, typer.Argument(help="a registered domain")],
    item: Annotated[Path, typer.Option(help="one item in the domain's raw row format (JSON)")],
    replies: Annotated[list[str] | None, typer.Argument(help="the model's replies, in order (after --)")] = None,
    harness: Annotated[Path | None, typer.Option(help="a harness file (default: the domain's h0)")] = None,
) -> None:
    """Run one episode whose model replies are given; print it as JSON (reward, turns, trace)."""
    try:
        raw = json.loads(item.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        _fail([f"--item: cannot read {item} as JSON: {exc}"], "replay")
    if domain not in plugins.available():
        _fail([f"unknown domain {domain!r}; registered: {', '.join(plugins.available())}"], "replay")
    from whale.replay import replay as run_replay

    try:
        episode = run_replay(domain, raw, list(replies or []), harness)
    except (ValueError, KeyError, OSError) as exc:
        _fail([str(exc)], "replay")
    typer.echo(json.dumps(episode, indent=2, default=str))


@app.command("domains")
def list_domains() -> None:
    """List the registered domains."""
    for name in plugins.available():
        typer.echo(name)


@app.command()
def prepare(
    file: FileArg,
    store: Annotated[
        str | None,
        typer.Option(
            help="DIR or s3://bucket/prefix (default: spec.execution.storage.uri, $WHALE_STORE, or ./.whale/store)"
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="where downloads go, resumed from there (default: $WHALE_CACHE_DIR/downloads)")
    ] = None,
    splits_only: Annotated[
        bool, typer.Option("--splits-only", help="skip the tool services' data (search_qa's wiki-18 index: ~80 GB)")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Fetch, verify and split the manifest's data into the store, before `whale run` or `kubectl apply`.

    spec.experiment.data.source full: the paper's datasets are downloaded (resumable), checked against their SHA-256 and
    recorded in the store's manifest, then split to the paper's sizes. A re-run with everything in place
    downloads and writes nothing."""
    from whale.data.fetch import FetchError
    from whale.data.full import FullDataError
    from whale.domain import DomainError
    from whale.store import StoreError
    from whale.workloads.common import load_domain
    from whale.workloads.prepare import PrepareError, prepare_data

    m, _ = _load_checked(file)
    try:
        st = _open_store(store, m)
        st.check()
        result = prepare_data(
            load_domain(m.spec, scores=False), m.spec, st, tool_data=not splits_only, cache_dir=cache_dir
        )
    except (FullDataError, FetchError, PrepareError, StoreError, DomainError, OSError) as exc:
        _fail([str(exc)], str(file))
    sources = [
        {"name": r.name, "action": r.action, "bytes": r.bytes, "sha256": r.sha256, "url": r.url} for r in result.sources
    ]
    if output == "json":
        typer.echo(
            json.dumps(
                {"store": st.uri, "source": m.spec.experiment.data.source, "sizes": result.sizes, "sources": sources},
                indent=2,
            )
        )
        return
    if sources:
        table = Table(title=f"{m.spec.domain}: full data in {st.uri}")
        for col in ("source", "done", "bytes", "sha256", "url"):
            table.add_column(col)
        for r in sources:
            table.add_row(r["name"], r["action"], f"{r['bytes']:,}", r["sha256"][:16], r["url"])
        console.print(table)
    sizes = result.sizes
    console.print(
        f"ok: {m.spec.domain} ({m.spec.experiment.data.source} data) prepared in {st.uri}: D_weight {sizes['weight']:,}, "
        f"D_harness {sizes['harness']:,}, D_test {sizes['test']:,}",
        highlight=False,
    )


app.command("report")(report_command)  # whale/report/cli.py
app.command("compare")(compare_command)  # whale/report/compare_cli.py


def main() -> None:
    app()


if __name__ == "__main__":
    main()
