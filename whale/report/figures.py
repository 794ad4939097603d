"""The report's figures, drawn with matplotlib's object API on the Agg canvas (headless, no pyplot state).

Two figures, each a :class:`matplotlib.figure.Figure` that tests can inspect and :func:`render` turns
into SVG or PNG bytes:

- ``mean_at_k``: the paper's headline — test mean@k (%) against training rollouts spent (left) and
  against global RSFT steps (right), one line per run, the best point of each run starred and labelled;
  under each panel a timeline with one row per run, its weight phases and harness phases shaded.
- ``training``: training reward per RSFT step, the kept fraction per step, and the harness phases'
  best D_harness score per iteration (the proposed candidates' scores as dots, phase starts dotted).

Every drawn series carries a ``gid`` (``mean-rollouts-<label>``, ``best-steps-<label>``,
``reward-<label>``, ``phase-rollouts-<label>-<phase>``, ...): SVG output names its groups by them, so a
figure can be checked after it is written. SVG text stays text (searchable, small); no date is written.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Literal

from whale.core.protocol import PhaseKind
from whale.report.series import RunSeries

FigureFormat = Literal["svg", "png"]

#: figure name -> what it shows (file stems and HTML captions)
FIGURES: dict[str, str] = {
    "mean_at_k": "Test mean@k against training rollouts spent and against RSFT steps",
    "training": "Training reward and kept fraction per RSFT step; harness score per search iteration",
}

WEIGHT_COLOUR = "#9ecae1"
HARNESS_COLOUR = "#fdae6b"
RC: dict[str, Any] = {
    "svg.fonttype": "none",  # text stays text: searchable, and a tenth of the size
    "font.size": 9,
    "axes.titlesize": 10,
}


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(
            "figures need matplotlib: pip install -e '.[plot]' in the checkout (or -o json, which needs nothing)"
        ) from None
    return matplotlib


def colour(i: int) -> str:
    return f"C{i % 10}"


def _percent(x: float) -> float:
    return 100.0 * x


def mean_at_k_figure(runs: Sequence[RunSeries]) -> Any:
    """Test mean@k against rollouts (left) and steps (right), with phase timelines below."""
    mpl = _mpl()
    from matplotlib.figure import Figure

    with mpl.rc_context(RC):
        fig = Figure(figsize=(12, 4.8 + 0.25 * len(runs)), layout="constrained")
        grid = fig.add_gridspec(2, 2, height_ratios=[4, 0.6 + 0.3 * max(1, len(runs))])
        for col, axis in enumerate(("rollouts", "steps")):
            ax = fig.add_subplot(grid[0, col])
            strip = fig.add_subplot(grid[1, col], sharex=ax)
            k = sorted({r.k for r in runs})
            ax.set_ylabel(f"test mean@{k[0] if len(k) == 1 else 'k'} (%)")
            ax.set_title("against training rollouts spent" if axis == "rollouts" else "against RSFT steps")
            ax.grid(True, alpha=0.3)
            for i, run in enumerate(runs):
                _draw_mean(ax, run, axis, colour(i))
                _draw_timeline(strip, run, axis, row=i)
            if len(runs) == 1:  # one run: its harness phases shaded on the plot itself too
                for span in runs[0].phases:
                    start = span.rollouts_start if axis == "rollouts" else span.step_start
                    end = span.rollouts_end if axis == "rollouts" else span.step_end
                    if span.kind is PhaseKind.HARNESS and end > start:
                        ax.axvspan(start, end, color=HARNESS_COLOUR, alpha=0.3, linewidth=0)
            if runs:
                ax.legend(loc="best", fontsize=8)
            strip.set_yticks(range(len(runs)), [r.label for r in runs])
            strip.set_ylim(-0.6, max(0, len(runs) - 1) + 0.6)
            strip.invert_yaxis()
            strip.set_xlabel("training rollouts spent" if axis == "rollouts" else "global RSFT step")
            from matplotlib.ticker import MaxNLocator

            strip.xaxis.set_major_locator(MaxNLocator(integer=True))
            strip.tick_params(axis="y", labelsize=8)
            ax.tick_params(labelbottom=False)
            from matplotlib.patches import Patch

            strip.legend(
                handles=[
                    Patch(color=WEIGHT_COLOUR, label="weight phase"),
                    Patch(color=HARNESS_COLOUR, label="harness phase"),
                ],
                loc="upper left",
                bbox_to_anchor=(1.0, 1.0),
                fontsize=7,
                frameon=False,
            )
        fig.suptitle("Test mean@k: " + ", ".join(f"{r.label} ({r.condition})" for r in runs), fontsize=10)
    return fig


def _draw_mean(ax: Any, run: RunSeries, axis: str, c: str) -> None:
    points = [e for e in run.evals if e.mean_at_k is not None]
    xs = [e.rollouts if axis == "rollouts" else e.step for e in points]
    ys = [_percent(e.mean_at_k or 0.0) for e in points]
    (line,) = ax.plot(xs, ys, marker="o", markersize=3.5, color=c, label=f"{run.label} ({run.condition})")
    line.set_gid(f"mean-{axis}-{run.label}")
    if run.best is not None:
        bx = run.best.rollouts if axis == "rollouts" else run.best.step
        by = _percent(run.best.mean_at_k)
        (star,) = ax.plot([bx], [by], marker="*", markersize=14, color=c, markeredgecolor="black", linestyle="none")
        star.set_gid(f"best-{axis}-{run.label}")
        ax.annotate(f"best {by:.2f}", (bx, by), textcoords="offset points", xytext=(6, 6), fontsize=8, color=c)


def _draw_timeline(strip: Any, run: RunSeries, axis: str, row: int) -> None:
    for span in run.phases:
        start = span.rollouts_start if axis == "rollouts" else span.step_start
        end = span.rollouts_end if axis == "rollouts" else span.step_end
        fill = WEIGHT_COLOUR if span.kind is PhaseKind.WEIGHT else HARNESS_COLOUR
        if end > start:
            bars = strip.broken_barh(
                [(start, end - start)],
                (row - 0.35, 0.7),
                facecolors=fill,
                edgecolors="white",
                linewidth=0.8,
                hatch=None if span.done else "//",
            )
            bars.set_gid(f"phase-{axis}-{run.label}-{span.phase}")
        else:  # a phase that moves nothing on this axis (a harness phase on the steps axis)
            (tick,) = strip.plot([start, start], [row - 0.35, row + 0.35], color=fill, linewidth=3)
            tick.set_gid(f"phase-{axis}-{run.label}-{span.phase}")


def training_figure(runs: Sequence[RunSeries]) -> Any:
    """Training reward and kept fraction per RSFT step; harness best score per iteration."""
    mpl = _mpl()
    from matplotlib.figure import Figure

    with mpl.rc_context(RC):
        fig = Figure(figsize=(12, 3.6), layout="constrained")
        reward, kept, harness = fig.subplots(1, 3)
        for ax, title, ylabel, xlabel in (
            (reward, "training reward per step", "mean reward of the step's rollouts", "global RSFT step"),
            (kept, "kept fraction per step", "rollouts kept for SFT (fraction)", "global RSFT step"),
            (
                harness,
                "harness score per iteration",
                "best D_harness score in the phase",
                "search iteration (run-wide)",
            ),
        ):
            ax.set_title(title)
            ax.set_ylabel(ylabel)
            ax.set_xlabel(xlabel)
            ax.grid(True, alpha=0.3)
        for i, run in enumerate(runs):
            c = colour(i)
            if run.weight_steps:
                xs = [s.step for s in run.weight_steps]
                (line,) = reward.plot(xs, [s.reward_mean for s in run.weight_steps], color=c, label=run.label)
                line.set_gid(f"reward-{run.label}")
                (line,) = kept.plot(xs, [s.kept_fraction for s in run.weight_steps], color=c, label=run.label)
                line.set_gid(f"kept-{run.label}")
            if run.harness_iterations:
                its = run.harness_iterations
                (line,) = harness.plot(
                    [h.index for h in its],
                    [h.best_score for h in its],
                    color=c,
                    marker="o",
                    markersize=3,
                    label=run.label,
                )
                line.set_gid(f"harness-{run.label}")
                dots = [(h.index, s) for h in its for s in h.candidate_scores]
                if dots:
                    scatter = harness.scatter([d[0] for d in dots], [d[1] for d in dots], color=c, s=8, alpha=0.4)
                    scatter.set_gid(f"candidates-{run.label}")
                for h in its:
                    if h.iteration == 1 and h.index > 1:
                        harness.axvline(h.index - 0.5, color=c, linestyle=":", linewidth=0.8)
        from matplotlib.ticker import MaxNLocator

        harness.xaxis.set_major_locator(MaxNLocator(integer=True))
        for ax, empty in ((reward, "no weight steps"), (kept, "no weight steps"), (harness, "no harness iterations")):
            if ax.get_lines():
                ax.legend(loc="best", fontsize=8)
            else:
                ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", color="grey")
    return fig


#: the axis labels of ``whale compare``'s band figure
_AXIS_LABELS = {
    "rollouts": "training rollouts spent",
    "steps": "global RSFT step",
    "gpu-hours": "GPU-hours of training (measured wall time x GPUs held)",
    "hours": "training wall hours (measured; CPU runs hold no GPU)",
}


def compare_axes(comparison: Any) -> tuple[str, str, str]:
    """The three panels: rollouts, steps, and GPU-hours — or, when no run of the comparison held a GPU (a CPU
    comparison, where every GPU-hour is 0), the measured training wall hours instead."""
    gpu = any(band.axis.value == "gpu-hours" and any(x > 0 for x in band.x) for band in comparison.bands)
    return "rollouts", "steps", "gpu-hours" if gpu else "hours"


def compare_figure(comparison: Any) -> Any:
    """``whale compare``: each group's mean test mean@k over its runs, with the band over seeds, against rollouts,
    RSFT steps and GPU-hours (wall hours for a CPU comparison; one panel each). ``comparison``: a
    :class:`whale.report.compare.Comparison`."""
    mpl = _mpl()
    from matplotlib.figure import Figure

    groups = [g.group for g in comparison.groups]
    with mpl.rc_context(RC):
        fig = Figure(figsize=(15, 4.6), layout="constrained")
        axes = fig.subplots(1, 3, sharey=True)
        for ax, axis in zip(axes, compare_axes(comparison), strict=True):
            ax.set_title(f"against {_AXIS_LABELS[axis]}")
            ax.set_xlabel(_AXIS_LABELS[axis])
            ax.grid(True, alpha=0.3)
            for band in comparison.bands:
                if band.axis.value != axis:
                    continue
                c = colour(groups.index(band.group))
                line = ax.plot(
                    band.x,
                    [_percent(y) for y in band.mean],
                    color=c,
                    marker="o",
                    markersize=3,
                    drawstyle="steps-post",
                    label=f"{band.group} (n={band.runs})",
                )[0]
                line.set_gid(f"band-mean-{axis}-{band.group}")
                if band.lo is not None and band.hi is not None:
                    fill = ax.fill_between(
                        band.x,
                        [_percent(y) for y in band.lo],
                        [_percent(y) for y in band.hi],
                        color=c,
                        alpha=0.2,
                        step="post",
                        linewidth=0,
                    )
                    fill.set_gid(f"band-{axis}-{band.group}")
            if ax.get_lines():
                ax.legend(loc="best", fontsize=7)
        axes[0].set_ylabel("test mean@k (%), mean over runs")
        confidence = comparison.groups[0].best.confidence if comparison.groups and comparison.groups[0].best else 0.95
        fig.suptitle(f"Test mean@k by group: mean over seeds, {confidence:.0%} band (Student t)", fontsize=10)
    return fig


def figures(runs: Sequence[RunSeries]) -> dict[str, Any]:
    """Every figure of a report, by name (the keys of :data:`FIGURES`)."""
    return {"mean_at_k": mean_at_k_figure(runs), "training": training_figure(runs)}


def render(fig: Any, fmt: FigureFormat) -> bytes:
    """The figure as SVG or PNG bytes (Agg canvas; no date in the file)."""
    mpl = _mpl()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if fmt not in ("svg", "png"):
        raise ValueError(f"figure format {fmt!r}: use svg or png")
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    with mpl.rc_context(RC):
        fig.savefig(buf, format=fmt, dpi=110, metadata=metadata)
    return buf.getvalue()
