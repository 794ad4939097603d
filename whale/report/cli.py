"""``whale report``: the command. A shell over :mod:`whale.report` and :mod:`whale.tracking`.

Registered in :mod:`whale.cli`; imports matplotlib, the store client and the trackers only when it runs,
so ``whale --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from whale.console.streams import cli_console

console = cli_console()
err = cli_console(stderr=True)

DEFAULT_OUT = Path("whale-report")
DASH = "–"


def _fail(message: str) -> None:
    err.print("[bold red]report:[/] ", end="")
    err.print(message, markup=False, highlight=False)
    raise typer.Exit(code=1)


def report(
    sources: Annotated[
        list[str],
        typer.Argument(
            metavar="STORE_OR_RUN...",
            help="stores (DIR, file:///DIR, s3://bucket/prefix) or runs (STORE/runs/NAME); S3 settings from "
            "WHALE_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY",
            show_default=False,
        ),
    ],
    run: Annotated[
        list[str] | None,
        typer.Option("--run", "-r", help="only this run of the stores given (repeat for more); default: every run"),
    ] = None,
    output: Annotated[
        list[str] | None,
        typer.Option(
            "--output",
            "-o",
            help="html | svg | png | json (repeat for more; default html). json alone without --out prints to stdout",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help=f"folder for the files (default ./{DEFAULT_OUT})")] = None,
    title: Annotated[str, typer.Option(help="the HTML page's title")] = "WHALE report",
    export: Annotated[
        list[str] | None,
        typer.Option(
            "--export",
            help="also replay the runs into tensorboard | wandb | mlflow (repeatable); TensorBoard "
            "event files go to OUT/tensorboard/<run>; W&B and MLflow read their usual "
            "environment (WANDB_MODE, WANDB_API_KEY, MLFLOW_TRACKING_URI)",
        ),
    ] = None,
    project: Annotated[str, typer.Option(help="W&B project / MLflow experiment for --export")] = "whale",
) -> None:
    """The paper's comparison: test mean@k against rollouts spent and RSFT steps, one line per run;
    training reward, kept fraction and harness score; a summary table like the paper's Table 1."""
    from whale.report.output import OutputFormat, json_text, write_report
    from whale.report.source import ReportError, load_runs

    try:
        formats = [OutputFormat(f.strip().lower()) for f in (output or ["html"])]
    except ValueError:
        _fail(f"--output {', '.join(output or [])}: choose from html, svg, png, json")
    backends = _backends(export or [])
    try:
        loaded = load_runs(sources, run or [])
    except ReportError as exc:
        _fail(str(exc))
    series = [r.series for r in loaded]
    if not series:
        _fail(f"no runs named {', '.join(run or [])} in {', '.join(sources)}")
    if formats == [OutputFormat.JSON] and out is None and not backends:
        typer.echo(json_text(series), nl=False)
        return
    folder = out or DEFAULT_OUT
    try:
        written = write_report(series, formats, folder, title=title)
    except RuntimeError as exc:  # matplotlib missing
        _fail(str(exc))
    except OSError as exc:
        _fail(f"--out {folder}: cannot write: {exc}")
    _print_summary(series)
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    if backends:
        _export(loaded, backends, folder, project)


def _backends(names: list[str]) -> list[str]:
    from whale.tracking import Backend

    out = []
    for name in names:
        try:
            out.append(Backend(name.strip().lower()).value)
        except ValueError:
            _fail(f"--export {name}: choose from {', '.join(b.value for b in Backend)}")
    return out


def _print_summary(series: list) -> None:
    from whale.report.page import describe_short, summary_row, where_short

    table = Table(title="test mean@k per run: best over the evaluation points, and the final point")
    for head in (
        "run",
        "condition",
        "best %",
        "final %",
        "paper %",
        "where (best)",
        "where (final)",
        "rollouts at best",
        "rollouts spent",
    ):
        table.add_column(head)
    for s in series:
        row = summary_row(s)
        paper = DASH if s.paper is None else f"{s.paper.mean_at_8_percent:.2f}"
        table.add_row(
            row["run"],
            row["condition"],
            row["best"],
            row["final"],
            paper,
            where_short(s),
            describe_short(s.final),
            row["rolloutsAtBest"],
            row["rolloutsSpent"],
        )
    console.print(table)
    for s in series:  # a flagged evaluation is never the best; say which and why under the table
        for e in s.evals:
            if e.flagged:
                console.print(
                    f"{s.label}: {e.phase} FLAGGED for reward integrity (never the best); see its result.json",
                    markup=False,
                    highlight=False,
                )


def _export(loaded: list, backends: list[str], folder: Path, project: str) -> None:
    from whale.report.source import accepted_harnesses
    from whale.tracking import RunIdentity, TrackingError, close_all, export_series, open_trackers

    for r in loaded:
        identity = RunIdentity(name=r.records.name, source=r.records.source)
        try:
            trackers = open_trackers(
                backends,
                identity,
                spec_wire=r.records.spec.to_wire(),
                project=project,
                tensorboard_dir=folder / "tensorboard",
            )
        except TrackingError as exc:
            _fail(str(exc))
        try:
            n = export_series(r.series, trackers, accepted_harnesses(r.store, r.records))
        finally:
            close_all(trackers)
        console.print(f"exported {n} points of {r.series.label} to {', '.join(backends)}", highlight=False)
