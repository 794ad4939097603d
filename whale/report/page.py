"""The summary table (like the paper's Table 1), the self-contained HTML page and the JSON document.

Pure: strings and dicts from :class:`~whale.report.series.RunSeries` (and figures already rendered to
SVG text). The page loads nothing: its style is inline and its figures are inline SVG, so it can be
mailed, attached to an issue or opened offline. Every value that comes from a store is escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from whale.report.paper import DOMAIN_COLUMNS, METHOD_NAMES, TABLE_1
from whale.report.series import BestPoint, RunSeries

#: the summary table's columns: (key, heading)
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "run"),
    ("domain", "domain"),
    ("condition", "condition"),
    ("schedule", "(E, I)"),
    ("status", "status"),
    ("best", "best mean@k (%)"),
    ("final", "final mean@k (%)"),
    ("k", "k"),
    ("paper", "paper, Table 1 (%)"),
    ("where", "where (best)"),
    ("finalWhere", "where (final)"),
    ("rolloutsAtBest", "rollouts at best"),
    ("rolloutsSpent", "rollouts spent"),
    ("steps", "RSFT steps"),
    ("weightHours", "weight-phase hours"),
    ("hours", "training hours"),
    ("gpuHours", "GPU-hours"),
)

DASH = "–"


def percent(x: float | None) -> str:
    """A fraction as the paper prints it: 0.29834 -> '29.83'."""
    return DASH if x is None else f"{100.0 * x:.2f}"


def describe(b: BestPoint | None) -> str:
    """Where a point is: ``cycle 1, step 3, after harness (eval-c01-s000003-harness)``; mh_only's points
    name their search iteration (``..., after harness, iteration 7 (...)``)."""
    if b is None:
        return DASH
    after = f", after {b.after}" if b.after else ""
    iteration = f", iteration {b.iteration}" if b.iteration is not None else ""
    return f"cycle {b.cycle}, step {b.step}{after}{iteration} ({b.phase})"


def describe_short(b: BestPoint | None) -> str:
    """The same, short: ``c01 s3 after harness`` (``... i7`` for mh_only's iteration points)."""
    if b is None:
        return DASH
    return (
        f"c{b.cycle:02d} s{b.step}"
        + (f" after {b.after}" if b.after else "")
        + (f" i{b.iteration}" if b.iteration is not None else "")
    )


def where(run: RunSeries) -> str:
    """Where the best point is."""
    return describe(run.best)


def where_short(run: RunSeries) -> str:
    """Where the best point is, short."""
    return describe_short(run.best)


def final_text(run: RunSeries) -> str:
    """The final point's mean@k; ``(latest)`` while the run has not ended (its status says so)."""
    if run.final is None:
        return DASH
    pending = not run.final_is_end and run.run_phase is not None
    return percent(run.final.mean_at_k) + (" (latest)" if pending else "")


def summary_row(run: RunSeries) -> dict[str, str]:
    """One row of the summary table, formatted (the HTML page and the terminal table print these)."""
    best = run.best
    paper = (
        f"{run.paper.mean_at_8_percent:.2f} ({run.paper.method}, {run.paper.column})" if run.paper is not None else DASH
    )
    steps = f"{run.steps}" + (f"/{run.total_steps}" if run.total_steps else "")
    return {
        "run": run.label,
        "domain": run.domain,
        "condition": run.condition,
        "schedule": run.schedule or DASH,
        "status": run.run_phase or "(status not in the store)",
        "best": percent(best.mean_at_k if best else None),
        "final": final_text(run),
        "k": str(best.k if best else run.k),
        "paper": paper,
        "where": where(run),
        "finalWhere": describe(run.final),
        "rolloutsAtBest": DASH if best is None else f"{best.rollouts:,}",
        "rolloutsSpent": f"{run.rollouts_spent:,}",
        "steps": steps,
        "weightHours": f"{run.weight_hours:.3f}",
        "hours": f"{run.hours:.3f}",
        "gpuHours": f"{run.gpu_hours:.2f}" + ("" if run.weight_gpus or run.harness_gpus else " (CPU run)"),
    }


def report_json(runs: Sequence[RunSeries]) -> dict[str, Any]:
    """The document ``whale report -o json`` prints: every series, and the paper's Table 1."""
    return {
        "runs": [run.to_dict() for run in runs],
        "paperTable1": {
            "source": "the WHALE paper, Table 1: best test mean@8 (%)",
            "columns": DOMAIN_COLUMNS,
            "rows": {METHOD_NAMES[c]: {"condition": c.value, **values} for c, values in TABLE_1.items()},
        },
    }


_SVG_PROLOGUE = re.compile(r"^\s*(<\?xml[^>]*\?>\s*)?(<!DOCTYPE[^>]*>\s*)?", re.DOTALL)

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem; color: #222; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 2rem; } h3 { font-size: 1rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1rem 0; } figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.85rem; color: #555; } .notes { font-size: 0.8rem; color: #555; }
.weight { background: #e7f1f8; } .harness { background: #fdf0e3; }
"""

_NUM = ' class="num"'
_NUMERIC = {"best", "final", "k", "rolloutsAtBest", "rolloutsSpent", "steps", "weightHours", "gpuHours"}


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def inline_svg(svg: str) -> str:
    """An SVG document as an element to put inside HTML (the XML prologue and DOCTYPE removed)."""
    return _SVG_PROLOGUE.sub("", svg, count=1)


def html_page(
    runs: Sequence[RunSeries], svgs: Mapping[str, str], captions: Mapping[str, str], title: str = "WHALE report"
) -> str:
    """The self-contained page: the summary table, the figures (inline SVG), each run's phases and notes."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        "<h2>Summary</h2>",
        '<table id="summary"><thead><tr>'
        + "".join(f'<th data-field="{key}">{_esc(head)}</th>' for key, head in SUMMARY_COLUMNS)
        + "</tr></thead><tbody>",
    ]
    for run in runs:
        row = summary_row(run)
        cells = "".join(
            f'<td data-field="{key}"{_NUM if key in _NUMERIC else ""}>{_esc(row[key])}</td>'
            for key, _ in SUMMARY_COLUMNS
        )
        out.append(f'<tr data-run="{_esc(run.label)}">{cells}</tr>')
    out.append("</tbody></table>")
    out.append(
        '<p class="notes">best mean@k: the highest test mean@k over the run\'s evaluation points (the '
        "paper's headline); final mean@k: the test mean@k of the run's last evaluation point, the agent it "
        "ends with (&quot;latest&quot; while it runs). A condition evaluated more often has more chances at a "
        "high best; each has one final point, so compare both. "
        "rollouts: training rollouts spent (weight and harness phases; evaluations not counted). "
        "The paper's number is shown when the run has the domain and condition of one of its 12 runs "
        "(and, for WHALE, its (E, I) = (0.6, 6)).</p>"
    )
    for name, svg in svgs.items():
        out.append(
            f'<figure id="figure-{_esc(name)}">{inline_svg(svg)}'
            f"<figcaption>{_esc(captions.get(name, name))}</figcaption></figure>"
        )
    for run in runs:
        out.append(f'<h2 id="run-{_esc(run.label)}">{_esc(run.label)}</h2>')
        out.append(
            f"<p>{_esc(run.source)} — {_esc(run.domain)}, {_esc(run.condition)}"
            f"{', ' + _esc(run.schedule) if run.schedule else ''}; evaluation points and best point from "
            f"{'status.json' if run.status_source.value == 'status' else 'the phase results'}.</p>"
        )
        out.append(
            '<table class="phases"><thead><tr><th>phase</th><th>rollouts</th><th>steps</th>'
            "<th>stopped by</th><th>accepted harness (score)</th></tr></thead><tbody>"
        )
        for span in run.phases:
            accepted = (
                f"{span.accepted_harness} ({span.accepted_score:.3f})"
                if span.accepted_harness and span.accepted_score is not None
                else DASH
            )
            out.append(
                f'<tr class="{_esc(span.kind.value)}"><td>{_esc(span.phase)}{"" if span.done else " (running)"}</td>'
                f'<td class="num">{span.rollouts_start:,} → {span.rollouts_end:,}</td>'
                f'<td class="num">{span.step_start} → {span.step_end}</td>'
                f"<td>{_esc(span.stopped_by or DASH)}</td><td>{_esc(accepted)}</td></tr>"
            )
        out.append("</tbody></table>")
        out.append(
            '<table class="evals"><thead><tr><th>evaluation</th><th>step</th><th>rollouts</th>'
            f"<th>mean@{run.k} (%)</th><th>harness</th></tr></thead><tbody>"
        )
        for e in run.evals:
            mark = " (best)" if run.best and e.phase == run.best.phase else ""
            mark += " (final)" if run.final and e.phase == run.final.phase and run.final_is_end else ""
            mark += " (FLAGGED: reward integrity)" if e.flagged else ""
            out.append(
                f'<tr><td>{_esc(e.phase)}{mark}</td><td class="num">{e.step}</td>'
                f'<td class="num">{e.rollouts:,}</td><td class="num">{percent(e.mean_at_k)}</td>'
                f"<td>{_esc(e.harness or 'h0')}</td></tr>"
            )
        out.append("</tbody></table>")
        if run.notes:
            out.append('<ul class="notes">' + "".join(f"<li>{_esc(n)}</li>" for n in run.notes) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
