"""Writing a report: the files each output format makes, each written atomically.

``html`` makes ``report.html`` (figures inline, nothing else needed); ``svg`` / ``png`` make one file per
figure (``mean_at_k.svg``, ``training.svg``, ...); ``json`` makes ``report.json``. A file is written to a
hidden temporary name beside its target and renamed into place, so a reader (a browser reloading the
page, a script polling the JSON) never sees half a report.
"""

from __future__ import annotations

import enum
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from whale.report.series import RunSeries


class OutputFormat(str, enum.Enum):
    HTML = "html"
    SVG = "svg"
    PNG = "png"
    JSON = "json"


def json_text(runs: Sequence[RunSeries]) -> str:
    from whale.report.page import report_json

    return json.dumps(report_json(runs), indent=2, allow_nan=False) + "\n"


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a report is for reading, like any file we write
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(
    runs: Sequence[RunSeries], formats: Iterable[OutputFormat], out_dir: Path, title: str = "WHALE report"
) -> list[Path]:
    """Write the report in every format asked for; returns the files written, in a stable order."""
    formats = list(dict.fromkeys(OutputFormat(f) for f in formats))
    written: list[Path] = []
    figs: dict[str, object] = {}
    if any(f is not OutputFormat.JSON for f in formats):
        from whale.report.figures import figures

        figs = figures(runs)
    for fmt in formats:
        if fmt is OutputFormat.JSON:
            path = out_dir / "report.json"
            write_atomic(path, json_text(runs).encode("utf-8"))
            written.append(path)
        elif fmt is OutputFormat.HTML:
            from whale.report.figures import FIGURES, render
            from whale.report.page import html_page

            svgs = {name: render(fig, "svg").decode("utf-8") for name, fig in figs.items()}
            path = out_dir / "report.html"
            write_atomic(path, html_page(runs, svgs, FIGURES, title=title).encode("utf-8"))
            written.append(path)
        else:
            from whale.report.figures import render

            for name, fig in figs.items():
                path = out_dir / f"{name}.{fmt.value}"
                write_atomic(path, render(fig, fmt.value))
                written.append(path)
    return written


def write_compare(
    comparison: Any,
    breakdown: Any,
    formats: Iterable[OutputFormat],
    out_dir: Path,
    title: str = "WHALE comparison",
) -> list[Path]:
    """``whale compare``'s files: ``compare.html`` (figure inline), ``compare.svg|png``, ``compare.json``.
    ``comparison``/``breakdown``: :class:`whale.report.compare.Comparison` / ``ItemBreakdown`` (or None)."""
    from whale.report.compare_page import compare_html, compare_json

    formats = list(dict.fromkeys(OutputFormat(f) for f in formats))
    written: list[Path] = []
    fig = None
    if any(f is not OutputFormat.JSON for f in formats):
        from whale.report.figures import compare_figure

        fig = compare_figure(comparison)
    for fmt in formats:
        if fmt is OutputFormat.JSON:
            path = out_dir / "compare.json"
            text = json.dumps(compare_json(comparison, breakdown), indent=2, allow_nan=False) + "\n"
            write_atomic(path, text.encode("utf-8"))
        elif fmt is OutputFormat.HTML:
            from whale.report.figures import render

            svg = render(fig, "svg").decode("utf-8")
            path = out_dir / "compare.html"
            write_atomic(path, compare_html(comparison, svg, breakdown, title=title).encode("utf-8"))
        else:
            from whale.report.figures import render

            path = out_dir / f"compare.{fmt.value}"
            write_atomic(path, render(fig, fmt.value))
        written.append(path)
    return written
