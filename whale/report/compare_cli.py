"""``whale compare``: a shell over :mod:`whale.report.compare` (the statistics) and :mod:`whale.report.source`
(reading the store). Registered in :mod:`whale.cli`; imports scipy, matplotlib and the store client only when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from whale.console.streams import cli_console
from whale.report.cli import _fail

if TYPE_CHECKING:
    from whale.report.compare import Comparison

console = cli_console()

DEFAULT_OUT = Path("whale-compare")


def compare(
    sources: Annotated[
        list[str],
        typer.Argument(
            metavar="STORE_OR_RUN...",
            help="stores (DIR, file:///DIR, s3://bucket/prefix) or runs (STORE/runs/NAME), as for whale report",
            show_default=False,
        ),
    ],
    run: Annotated[
        list[str] | None,
        typer.Option("--run", "-r", help="only this run of the stores given (repeat for more); default: every run"),
    ] = None,
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by",
            help="also group by this spec field, a dotted camelCase path (repeatable), e.g. "
            "harnessSearch.proposer.backend; runs are always grouped by condition",
        ),
    ] = None,
    items: Annotated[
        list[str] | None,
        typer.Option("--items", help="two runs (give it twice) whose test items are broken down one by one"),
    ] = None,
    confidence: Annotated[float, typer.Option(help="level of every interval")] = 0.95,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples per pair of groups", min=99, max=100_000)] = 9999,
    seed: Annotated[int, typer.Option(help="seed of the bootstrap resampling")] = 0,
    output: Annotated[
        list[str] | None,
        typer.Option("--output", "-o", help="html | svg | png | json (repeat for more; default html)"),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help=f"folder for the files (default ./{DEFAULT_OUT})")] = None,
    title: Annotated[str, typer.Option(help="the HTML page's title")] = "WHALE comparison",
) -> None:
    """Conditions compared over repeats: runs grouped by condition (and --by fields), the mean test mean@k with a
    band over seeds against rollouts, RSFT steps and weight-phase hours, best-over-points beside final, and a
    paired bootstrap interval over test items for each pair of groups."""
    from whale.report.compare import compare as build
    from whale.report.compare import item_breakdown
    from whale.report.output import OutputFormat, write_compare
    from whale.report.source import ReportError, load_compare_runs

    try:
        formats = [OutputFormat(f.strip().lower()) for f in (output or ["html"])]
    except ValueError:
        _fail(f"--output {', '.join(output or [])}: choose from html, svg, png, json")
    if not 0 < confidence < 1:
        _fail(f"--confidence {confidence}: give a level between 0 and 1, e.g. 0.95")
    if items is not None and len(items) != 2:
        _fail(f"--items: give exactly two runs (--items A --items B), got {len(items)}")
    try:
        runs = load_compare_runs(sources, run or [], by or [])
    except ReportError as exc:
        _fail(str(exc))
    if not runs:
        _fail(f"no runs named {', '.join(run or [])} in {', '.join(sources)}")
    breakdown = None
    if items is not None:
        by_name = {r.label: r for r in runs} | {r.series.name: r for r in runs}
        missing = [name for name in items if name not in by_name]
        if missing:
            _fail(f"--items {', '.join(missing)}: not among the runs compared ({', '.join(r.label for r in runs)})")
        breakdown = item_breakdown(by_name[items[0]], by_name[items[1]])
    comparison = build(runs, confidence=confidence, resamples=resamples, seed=seed)
    folder = out or DEFAULT_OUT
    try:
        written = write_compare(comparison, breakdown, formats, folder, title=title)
    except RuntimeError as exc:  # matplotlib missing
        _fail(str(exc))
    except OSError as exc:
        _fail(f"--out {folder}: cannot write: {exc}")
    _print(comparison, confidence)
    for path in written:
        console.print(f"wrote {path}", highlight=False)


def _print(comparison: Comparison, confidence: float) -> None:
    from whale.report.compare_page import GROUP_COLUMNS, PAIR_COLUMNS, group_rows, pair_rows

    for title, columns, rows in (
        (f"groups: mean over runs [{confidence:.0%} CI over seeds]", GROUP_COLUMNS, group_rows(comparison)),
        (
            f"pairs: final A - B over shared test items [{confidence:.0%} paired bootstrap CI]",
            PAIR_COLUMNS,
            pair_rows(comparison),
        ),
    ):
        table = Table(title=title)
        for _, head in columns:
            table.add_column(head)
        for row in rows:
            table.add_row(*(row[k] for k, _ in columns))
        console.print(table)
    for note in comparison.notes:
        console.print(note, markup=False, highlight=False)
