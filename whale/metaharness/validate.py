"""Candidate validation before anything runs: the size cap, the harness runtime's static rules
(``whale.harness.validate.check_source``: syntax, forbidden imports/names, the ``Harness`` class,
hook signatures, constant types) and, in promptOnly search, its promptOnly rule
(``check_prompt_only``) against the *incoming* harness of the phase. Pure: strings in, messages out.

The rules themselves live in the runtime (one source of truth for what a harness may be); this
module only decides which apply to a proposer's candidate.
"""

from __future__ import annotations

from collections.abc import Iterable

from whale.harness.validate import Violation, check_prompt_only, check_source

#: the largest candidate file accepted (a harness is one modest Python file)
MAX_CANDIDATE_BYTES = 200_000
FILENAME = "harness.py"


def candidate_problems(code: str, *, incoming: str, allowed_imports: Iterable[str], prompt_only: bool) -> list[str]:
    """Every rule the candidate breaks, one ``harness.py:LINE: [rule] message`` each (empty = valid)."""
    size = len(code.encode("utf-8"))
    if size > MAX_CANDIDATE_BYTES:
        return [
            Violation(1, "size", f"{size} bytes; a candidate may have at most {MAX_CANDIDATE_BYTES}").render(FILENAME)
        ]
    violations = check_source(code, allowed_imports)
    if prompt_only and not any(v.rule == "syntax" for v in violations):
        violations = [*violations, *check_prompt_only(code, incoming)]
    return [v.render(FILENAME) for v in violations]
