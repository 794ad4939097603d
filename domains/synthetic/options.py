"""synthetic's options (``spec.experiment.domainOptions``): which task it asks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from whale.domain import DomainOptions


class SyntheticOptions(DomainOptions):
    synthetic_task: Literal["repeat", "addition"] = Field(
        "repeat",
        description="repeat = repeat a digit (the demo's, which a tiny model learns in seconds); addition = the sum "
        "of two digits (`What is 3 + 5?`), the harder task of the local SmolLM2 comparison (docs/local.md), with its "
        "own h0 and skill",
    )
