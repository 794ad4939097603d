"""whale.report.figures and page: what is drawn is the series' data; the page is self-contained and escaped."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_report_series import whale_records
from whale.report.figures import figures, mean_at_k_figure, render, training_figure
from whale.report.page import html_page, report_json, summary_row
from whale.report.series import build_series

pytest.importorskip("matplotlib")


@pytest.fixture
def runs():
    a = build_series(whale_records(), label="r")
    b = build_series(whale_records(), label="other")
    return [a, b]


def gids(fig) -> dict[str, object]:
    return {a.get_gid(): a for ax in fig.axes for a in ax.get_children() if a.get_gid()}


def test_mean_at_k_figure_draws_one_line_per_run_on_both_axes(runs):
    fig = mean_at_k_figure(runs)
    drawn = gids(fig)
    for run in runs:
        line = drawn[f"mean-rollouts-{run.label}"]
        assert list(line.get_xdata()) == [e.rollouts for e in run.evals]
        assert list(line.get_ydata()) == pytest.approx([100 * e.mean_at_k for e in run.evals])
        assert list(drawn[f"mean-steps-{run.label}"].get_xdata()) == [e.step for e in run.evals]
        star = drawn[f"best-rollouts-{run.label}"]
        assert (list(star.get_xdata()), list(star.get_ydata())) == ([26], [pytest.approx(40.0)])
        assert list(drawn[f"best-steps-{run.label}"].get_xdata()) == [2]
        # every phase shaded in both timelines
        for axis in ("rollouts", "steps"):
            assert {p.phase for p in run.phases} == {
                g.split(f"phase-{axis}-{run.label}-", 1)[1] for g in drawn if g.startswith(f"phase-{axis}-{run.label}-")
            }
    labels = {ax.get_xlabel() for ax in fig.axes} | {ax.get_ylabel() for ax in fig.axes}
    assert {"training rollouts spent", "global RSFT step", "test mean@8 (%)"} <= labels


def test_unfinished_evaluations_are_not_drawn(runs):
    import dataclasses

    run = runs[0]
    evals = (*run.evals[:-1], dataclasses.replace(run.evals[-1], mean_at_k=None))
    fig = mean_at_k_figure([dataclasses.replace(run, evals=evals)])
    assert len(gids(fig)["mean-rollouts-r"].get_xdata()) == len(run.evals) - 1


def test_training_figure_draws_reward_kept_and_harness_score(runs):
    drawn = gids(training_figure(runs[:1]))
    run = runs[0]
    assert list(drawn["reward-r"].get_ydata()) == [s.reward_mean for s in run.weight_steps]
    assert list(drawn["kept-r"].get_ydata()) == [s.kept_fraction for s in run.weight_steps]
    assert list(drawn["harness-r"].get_xdata()) == [1, 2]
    assert list(drawn["harness-r"].get_ydata()) == pytest.approx([0.1, 0.2])
    assert len(drawn["candidates-r"].get_offsets()) == 2


def test_render_gives_searchable_svg_and_png(runs):
    fig = figures(runs)["mean_at_k"]
    text = render(fig, "svg").decode()
    assert 'id="mean-rollouts-r"' in text and 'id="best-steps-other"' in text
    assert "training rollouts spent" in text and "<dc:date>" not in text  # text stays text; no date
    assert render(fig, "png").startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ValueError, match="svg or png"):
        render(fig, "pdf")


def test_html_page_is_self_contained_and_escapes_store_text(runs):
    svgs = {name: render(fig, "svg").decode() for name, fig in figures(runs).items()}
    page = html_page(runs, svgs, {"mean_at_k": "caption <b>"}, title="t & t")
    assert page.startswith("<!DOCTYPE html>") and "<title>t &amp; t</title>" in page
    assert "<?xml" not in page and page.count("<svg") == 2
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "&lt;script&gt;x&lt;/script&gt;" in page  # an eval note from the store
    assert "caption &lt;b&gt;" in page
    row = re.search(r'<tr data-run="r">(.*?)</tr>', page).group(1)
    assert '<td data-field="best" class="num">40.00</td>' in row
    assert '<td data-field="rolloutsAtBest" class="num">26</td>' in row


def test_summary_row_and_json(runs):
    row = summary_row(runs[0])
    assert (
        row["best"] == "40.00"
        and row["rolloutsSpent"] == "46"
        and row["gpuHours"] == "0.04"
        and row["hours"] == "0.037"
    )
    assert row["paper"] == "–"  # (2 steps, 2) is not the paper's (0.6, 6)
    assert row["where"] == "cycle 1, step 2, after harness (eval-c01-s000002-harness)"
    doc = report_json(runs)
    assert [r["label"] for r in doc["runs"]] == ["r", "other"]
    assert doc["paperTable1"]["rows"]["WHALE (0.6, 6)"]["chess_puzzles"] == 29.83
