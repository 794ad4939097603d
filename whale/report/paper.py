"""The paper's headline numbers, to print beside a run that repeats one of its 12 runs.

Source: the WHALE paper, Table 1 — best test mean@8 (%) per method and domain (search QA: the
average over its 7 benchmarks; math: AIME 2024 + 2025; chess: the 256 test puzzles). Adaptive WHALE
was not run on chess. Pure: data and one lookup.
"""

from __future__ import annotations

import dataclasses

from whale.core.spec import Condition, WhaleRunSpec

#: the column of Table 1 for each domain plugin
DOMAIN_COLUMNS: dict[str, str] = {
    "search_qa": "search QA avg (7)",
    "math_reasoning": "AIME 24+25",
    "chess_puzzles": "chess",
}

#: the (E, I) schedule of the paper's fixed WHALE row: E = 0.6 epoch of D_weight, I = 6 iterations
PAPER_WHALE_SCHEDULE = (0.6, 6)

#: WHALE paper, Table 1: best mean@8 (%) by condition, then domain; None where the paper has "–"
TABLE_1: dict[Condition, dict[str, float | None]] = {
    Condition.MH_ONLY: {"search_qa": 38.29, "math_reasoning": 0.42, "chess_puzzles": 19.82},
    Condition.RSFT_ONLY: {"search_qa": 38.27, "math_reasoning": 15.42, "chess_puzzles": 22.17},
    Condition.WHALE: {"search_qa": 48.34, "math_reasoning": 24.79, "chess_puzzles": 29.83},
    Condition.ADAPTIVE_WHALE: {"search_qa": 52.82, "math_reasoning": 26.46, "chess_puzzles": None},
}

#: the row names Table 1 prints
METHOD_NAMES: dict[Condition, str] = {
    Condition.MH_ONLY: "harness-only",
    Condition.RSFT_ONLY: "weight-only",
    Condition.WHALE: "WHALE (0.6, 6)",
    Condition.ADAPTIVE_WHALE: "adaptive WHALE",
}


@dataclasses.dataclass(frozen=True)
class PaperNumber:
    """The paper's best mean@8 for the run's domain and condition."""

    #: Table 1's row, e.g. "WHALE (0.6, 6)"
    method: str
    #: Table 1's column, e.g. "chess"
    column: str
    #: best mean@8 in percent
    mean_at_8_percent: float


def paper_number(spec: WhaleRunSpec) -> PaperNumber | None:
    """Table 1's number for a run of the same domain and condition (and, for ``whale``, the paper's
    (E, I) = (0.6, 6) given in epochs), or None when the paper has no such run."""
    column = DOMAIN_COLUMNS.get(spec.domain)
    if column is None:
        return None
    if spec.condition is Condition.WHALE:
        sched = spec.experiment.schedule
        if (sched.weight_epochs_per_cycle, sched.harness_iterations_per_cycle) != PAPER_WHALE_SCHEDULE:
            return None
    value = TABLE_1[spec.condition].get(spec.domain)
    if value is None:
        return None
    return PaperNumber(method=METHOD_NAMES[spec.condition], column=column, mean_at_8_percent=value)
