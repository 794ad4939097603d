"""math_reasoning's options (``spec.experiment.domainOptions``): its problem set and how a final reply is scored."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from whale.domain import DomainOptions


class MathOptions(DomainOptions):
    math_set: Literal["aime", "gsm8k"] = Field(
        "aime",
        description="the problem set: aime = the paper's (D_test AIME 2024 + 2025, D_weight and D_harness from the "
        "MATH train pool); gsm8k = grade-school word problems (D_weight and D_harness from GSM8K train, D_test from "
        "GSM8K test, 1,319 problems), for models whose AIME score can only be 0",
    )
    math_answer: Literal["dapo", "mathVerify"] = Field(
        "dapo",
        description="dapo (the paper's) = the reference code's strict DAPO match (verl's math_dapo with "
        "strict_box_verify): the last \\boxed{...} in the final reply's last 100 characters must be exactly the gold "
        "answer's string (no normalisation: 0.5 is not \\frac{1}{2}, ' 204' is not '204'); mathVerify = the last box "
        "anywhere in the final reply, math-verify's symbolic equivalence with the gold one",
    )
