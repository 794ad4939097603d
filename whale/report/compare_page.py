"""``whale compare``'s page and JSON: the group table, the pairs table, the band figure and, for two chosen runs,
the per-item breakdown. Pure: strings and dicts from :mod:`whale.report.compare` (the figure already SVG text);
every value from a store is escaped."""

from __future__ import annotations

from typing import Any

from whale.report.compare import Comparison, Interval, ItemBreakdown
from whale.report.page import DASH, STYLE, _esc, inline_svg


def interval_text(iv: Interval | None, scale: float = 100.0) -> str:
    """``48.34 [45.10, 51.58]`` (percent), or the mean alone when there is no interval (one run)."""
    if iv is None:
        return DASH
    if iv.lo is None or iv.hi is None:
        return f"{scale * iv.mean:.2f}"
    return f"{scale * iv.mean:.2f} [{scale * iv.lo:.2f}, {scale * iv.hi:.2f}]"


def group_rows(comparison: Comparison) -> list[dict[str, str]]:
    out = []
    for g in comparison.groups:
        points = str(g.points_min) if g.points_min == g.points_max else f"{g.points_min}–{g.points_max}"
        out.append(
            {
                "group": g.group,
                "runs": str(len(g.runs)),
                "seeds": ", ".join(DASH if s is None else str(s) for s in g.seeds),
                "best": interval_text(g.best),
                "final": interval_text(g.final),
                "points": points,
                "rollouts": f"{g.rollouts_spent:,.0f}",
            }
        )
    return out


GROUP_COLUMNS = (
    ("group", "group"),
    ("runs", "runs"),
    ("seeds", "seeds"),
    ("best", "best over evaluation points (%), mean [CI]"),
    ("points", "evaluation points"),
    ("final", "final (%), mean [CI]"),
    ("rollouts", "rollouts spent (mean)"),
)


def pair_rows(comparison: Comparison) -> list[dict[str, str]]:
    out = []
    for p in comparison.pairs:
        ci = DASH if p.lo is None or p.hi is None else f"[{100 * p.lo:+.2f}, {100 * p.hi:+.2f}]"
        differs = DASH if p.lo is None or p.hi is None else ("yes" if p.lo > 0 or p.hi < 0 else "no")
        out.append(
            {
                "a": p.a,
                "b": p.b,
                "items": str(p.items),
                "diff": DASH if p.items == 0 else f"{100 * p.diff:+.2f}",
                "ci": ci,
                "differs": differs,
                "note": p.note or "",
            }
        )
    return out


PAIR_COLUMNS = (
    ("a", "A"),
    ("b", "B"),
    ("items", "test items"),
    ("diff", "final A - B (points)"),
    ("ci", "paired bootstrap CI"),
    ("differs", "CI excludes 0"),
    ("note", "note"),
)


def _table(table_id: str, columns: tuple[tuple[str, str], ...], rows: list[dict[str, str]]) -> str:
    head = "".join(f'<th data-field="{k}">{_esc(h)}</th>' for k, h in columns)
    body = "".join(
        "<tr>" + "".join(f'<td data-field="{k}">{_esc(row[k])}</td>' for k, _ in columns) + "</tr>" for row in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _score(v: float | None) -> str:
    return DASH if v is None else f"{v:.2f}"


def breakdown_html(b: ItemBreakdown) -> str:
    out = [
        f'<h2 id="items">Per item: {_esc(b.a)} against {_esc(b.b)}</h2>',
        f"<p>At each run's final evaluation point; an item counts as solved when its mean reward over the k samples "
        f"is above 0.5. Both: {b.both}; only {_esc(b.a)}: {b.only_a}; only {_esc(b.b)}: {b.only_b}; "
        f"neither: {b.neither}. Items solved by one run only come first.</p>",
        f'<table id="per-item"><thead><tr><th>item</th><th>{_esc(b.a)}</th><th>{_esc(b.b)}</th></tr></thead><tbody>',
    ]
    for r in b.rows:
        out.append(
            f'<tr data-item="{_esc(r.item)}"><td>{_esc(r.item)}</td>'
            f'<td class="num">{_score(r.a)}</td><td class="num">{_score(r.b)}</td></tr>'
        )
    out.append("</tbody></table>")
    return "\n".join(out)


def compare_html(
    comparison: Comparison, svg: str | None, breakdown: ItemBreakdown | None, title: str = "WHALE comparison"
) -> str:
    """The self-contained page (inline style, inline SVG)."""
    confidence = next((g.best.confidence for g in comparison.groups if g.best is not None), 0.95)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        "<h2>Groups</h2>",
        _table("groups", GROUP_COLUMNS, group_rows(comparison)),
        f'<p class="notes">Mean over each group\'s runs (its seeds) with the {confidence:.0%} Student-t interval. '
        "Best: the highest test mean@k over a run's evaluation points (the paper's headline, higher the more "
        "points there are); final: its last evaluation point. Evaluation points: how many the best was taken "
        "over.</p>",
        "<h2>Pairs</h2>",
        _table("pairs", PAIR_COLUMNS, pair_rows(comparison)),
        f'<p class="notes">Final test score of A minus B over the test items both were evaluated on (each item\'s '
        f"mean reward, averaged over the group's runs), with a {confidence:.0%} paired percentile bootstrap "
        "interval over items (scipy.stats.bootstrap): it resamples items, not seeds.</p>",
    ]
    if svg is not None:
        out.append(
            f'<figure id="figure-compare">{inline_svg(svg)}<figcaption>Mean test mean@k per group with the band '
            "over seeds, against rollouts, RSFT steps and GPU-hours of training (measured wall time x the GPUs each "
            "phase held; training wall hours when no run held a GPU)</figcaption></figure>"
        )
    if comparison.notes:
        out.append('<ul class="notes">' + "".join(f"<li>{_esc(n)}</li>" for n in comparison.notes) + "</ul>")
    if breakdown is not None:
        out.append(breakdown_html(breakdown))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def compare_json(comparison: Comparison, breakdown: ItemBreakdown | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"kind": "whale-compare", "version": 1, **comparison.to_dict()}
    if breakdown is not None:
        doc["items"] = breakdown.to_dict()
    return doc
