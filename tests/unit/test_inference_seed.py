"""Call seeds: a stable hash of (run seed, item, sample, turn), and the seed field of the spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from whale.inference.base import MAX_CALL_SEED, call_seed
from whale.spec import Evaluation


def test_call_seed_is_stable_and_spread() -> None:
    # pinned: a stable hash (not Python's salted hash()), the same in every process and version
    assert call_seed(0, "item-1", 0, 0) == call_seed(0, "item-1", 0, 0) == 1634167258
    seeds = {
        call_seed(seed, item, sample, turn)
        for seed in (0, 1)
        for item in ("a", "b")
        for sample in (0, 1, "shared")
        for turn in (0, 1)
    }
    assert len(seeds) == 24
    assert all(0 <= s < MAX_CALL_SEED for s in seeds)
    # a signed 32-bit seed field still takes seed + j for every completion j of one call
    assert MAX_CALL_SEED + 1024 < 2**31


def test_evaluation_seed_defaults_to_reproducible_and_is_strict() -> None:
    assert Evaluation().seed == 0
    assert Evaluation(seed=None).seed is None
    assert Evaluation.model_validate({"seed": 42}).seed == 42
    for bad in ("1", 1.5, True, 2**63):
        with pytest.raises(ValidationError, match="seed"):
            Evaluation.model_validate({"seed": bad})
