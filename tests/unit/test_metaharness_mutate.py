"""The ``mutate`` proposer (blind search): what it may change, that its candidates are valid harnesses, that one
seed gives one search, and that it plugs into the spec and the proposer factory without a key."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from whale.core.spec import WhaleRunSpec
from whale.metaharness.mutate import PROMPT_FRAGMENTS, knobs, mutate, mutate_int, mutate_string
from whale.metaharness.proposer import environment_problems, from_spec, spec_problems
from whale.metaharness.proposer.base import ProposalRequest
from whale.metaharness.proposer.mutate import MutateProposer
from whale.metaharness.validate import candidate_problems

ROOT = Path(__file__).resolve().parents[2]
H0 = {d: (ROOT / "domains" / d / "h0.py").read_text() for d in ("synthetic", "search_qa", "math_reasoning")}
IMPORTS = ("re", "json", "collections", "itertools", "math", "random", "statistics", "string")


def request(code: str, iteration: int = 2, count: int = 3) -> ProposalRequest:
    return ProposalRequest(
        iteration=iteration,
        count=count,
        archive_dir=Path("/nonexistent"),
        scratch_dir=Path("/nonexistent"),
        skill="",
        incoming_code=code,
        incoming_id="h0",
        prompt_only=False,
        allowed_imports=IMPORTS,
        timeout_s=10,
        max_turns=1,
        max_tokens=1,
    )


def test_knobs_are_the_literal_constants_of_the_harness_class():
    names = {k.name for k in knobs(H0["search_qa"])}
    # prompts, the turn limit, the retry rule and the tool budgets; TOOLS (a list) is not a knob
    assert names == {
        "SYSTEM_PROMPT",
        "USER_TEMPLATE",
        "MAX_TURNS",
        "MAX_FORMAT_RETRIES",
        "FORMAT_RETRY_MESSAGE",
        "TOPK",
        "MAX_DOC_TOKENS",
    }
    assert knobs("x = (") == [] and knobs("A = 1") == []


def test_integer_knobs_stay_in_bounds_and_templates_keep_their_fields():
    rng = random.Random(0)
    for _ in range(200):
        assert 1 <= mutate_int("MAX_TURNS", 1, rng) <= 4
        assert 0 <= mutate_int("TOPK", 3, rng) <= 12
    template = "Question: {question}\nUse the search tool if needed. Put the answer inside <answer></answer>."
    for _ in range(200):
        out = mutate_string("USER_TEMPLATE", template, rng)
        assert "{question}" in out and out != template
    assert mutate_string("SYSTEM_PROMPT", "", rng) in PROMPT_FRAGMENTS


@pytest.mark.parametrize("domain", sorted(H0))
def test_every_candidate_is_a_valid_harness_differing_only_in_knobs(domain):
    code = H0[domain]
    rng = random.Random(1)
    before = {k.name: k.value for k in knobs(code)}
    for _ in range(30):
        m = mutate(code, rng)
        assert m is not None and m.code != code and 1 <= len(m.changes) <= 2
        assert candidate_problems(m.code, incoming=code, allowed_imports=IMPORTS, prompt_only=False) == []
        after = {k.name: k.value for k in knobs(m.code)}
        changed = {n for n in before if before[n] != after[n]}
        assert changed == {c.split(":")[0] for c in m.changes}


def test_one_seed_gives_one_search_and_another_seed_another():
    code = H0["search_qa"]
    a = asyncio.run(MutateProposer(5).propose(request(code)))
    b = asyncio.run(MutateProposer(5).propose(request(code)))
    c = asyncio.run(MutateProposer(6).propose(request(code)))
    assert [p.code for p in a.proposals] == [p.code for p in b.proposals]
    assert [p.code for p in a.proposals] != [p.code for p in c.proposals]
    assert len(a.proposals) == 3 and len({p.code for p in a.proposals}) == 3  # distinct, none the incoming
    assert all(p.rationale.startswith("blind mutation: ") for p in a.proposals)
    assert [p.name for p in a.proposals] == ["mutate-i2-1", "mutate-i2-2", "mutate-i2-3"]
    # another iteration draws other candidates
    d = asyncio.run(MutateProposer(5).propose(request(code, iteration=3)))
    assert [p.code for p in d.proposals] != [p.code for p in a.proposals]


def test_a_harness_without_knobs_gets_a_note_not_an_error():
    code = "from whale.harness.api import BaseHarness\n\nclass Harness(BaseHarness):\n    pass\n"
    report = asyncio.run(MutateProposer(0).propose(request(code)))
    assert report.proposals == [] and "no literal knob" in report.notes[0]


def test_the_spec_takes_mutate_and_it_needs_no_key():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "mh_only",
            "model": {"name": "m"},
            "seed": 9,
            "harnessSearch": {"proposer": {"backend": "mutate"}},
        }
    )
    assert spec.experiment.harness_search.seed == 9
    assert spec_problems(spec) == [] and environment_problems(spec, environ={}) == []
    proposer = from_spec(spec.experiment.harness_search.proposer, environ={}, seed=spec.experiment.harness_search.seed)
    assert isinstance(proposer, MutateProposer) and proposer.seed == 9
