"""The harness phase end to end: the search workload with the built-in proposer loop talking HTTP to
a scripted proposer double, the real harness runtime (sandboxed harness processes), the synthetic
domain and a policy double whose format only a better harness can fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.proposer_double import (
    DigitSayerPolicyDouble,
    ScriptedProposerServerDouble,
    assistant,
    tool_call,
)
from whale.core import layout
from whale.core.protocol import HarnessPhaseArgs, HarnessStopRule, phase_request
from whale.metaharness.archive import Archive
from whale.metaharness.evaluate import EvalSettings
from whale.metaharness.records import Status
from whale.store import open_store
from whale.workloads.search import run_search

RUN = "mh-test"
PHASE = layout.harness_phase_key(1)

GOOD = '''"""Extract the digit the model names and submit it inside the tag the verifier reads."""
import re

from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        tagged = re.findall(r"<answer>\\s*(.*?)\\s*</answer>", text, re.DOTALL)
        digits = re.findall(r"\\d", text)
        answer = tagged[-1] if tagged else (digits[-1] if digits else "")
        return env_action(f"<answer>{answer}</answer>")
'''
SYNTAX_ERROR = "from whale.harness.api import BaseHarness\n\nclass Harness(BaseHarness:\n    MAX_TURNS = 1\n"
FORBIDDEN_IMPORT = GOOD.replace("import re\n", "import re\nimport subprocess\n")
INFINITE_LOOP = GOOD.replace(
    "        tagged = re.findall", "        while True:\n            pass\n        tagged = re.findall"
)
INTERFACE_VIOLATION = GOOD.replace("def parse_action(self, text, state):", "def parse_action(self, text):")
NONSENSE_DECISION = GOOD + "\n    def parse(self, reply, state):\n        return 'yes'\n"


def _h0() -> str:
    from synthetic import HERE

    return (HERE / "h0.py").read_text()


def _spec(base_url: str, *, prompt_only: bool = False) -> dict:
    return {
        "domain": "synthetic",
        "condition": "mh_only",
        "model": {"name": "unused-policy-is-a-double"},
        "data": {"harnessSize": 6},
        "harnessSearch": {
            "proposalsPerIteration": 3,
            "smokeTestItems": 2,
            "promptOnly": prompt_only,
            "proposer": {"backend": "openai", "baseUrl": base_url, "model": "scripted-double", "timeoutSeconds": 60},
        },
    }


def _request(store, spec: dict, iterations: int, stop_rule: HarnessStopRule | None = None) -> None:
    request = phase_request(
        spec,
        run=RUN,
        phase=PHASE,
        attempt=1,
        args=HarnessPhaseArgs(
            cycle=1,
            incoming_harness=None,
            checkpoint=None,
            step=0,
            iterations=iterations,
            stop_rule=stop_rule,
            archive=layout.archive_prefix(RUN, 1),
        ),
    )
    store.write_json(layout.spec_key(RUN), spec)
    store.write_json(layout.request_key(RUN, PHASE), request.to_wire())


SETTINGS = EvalSettings(
    smoke_items=2, smoke_hook_timeout_s=3.0, smoke_timeout_s=30, candidate_timeout_s=60, max_concurrency=8
)


def _script() -> list:
    return [
        # iteration 2: read the summary and the incoming harness's traces, then write three candidates
        assistant(
            tool_call("read_file", "a", path="summary.md"),
            tool_call("read_file", "b", path="candidates/i01-incoming/traces.jsonl"),
        ),
        assistant(tool_call("grep", "c", pattern="The digit is", path="candidates")),
        assistant(
            tool_call(
                "write_candidate",
                "d",
                name="extract_digit",
                code=GOOD,
                rationale="Replies name the digit without the tag; extract it and wrap it.",
            ),
            tool_call("write_candidate", "e", name="broken_syntax", code=SYNTAX_ERROR),
            tool_call("write_candidate", "f", name="shell_out", code=FORBIDDEN_IMPORT),
        ),
        assistant(tool_call("finish", "g", summary="three candidates")),
        # iteration 3: three more broken ones
        assistant(
            tool_call("write_candidate", "h", name="spin", code=INFINITE_LOOP),
            tool_call("write_candidate", "i", name="bad_signature", code=INTERFACE_VIOLATION),
            tool_call("write_candidate", "j", name="nonsense", code=NONSENSE_DECISION),
        ),
        assistant(tool_call("finish", "k")),
        # iteration 4: a plain-text reply first (nudged), then a revert to the good candidate
        assistant(content="Let me think about it."),
        assistant(tool_call("write_candidate", "l", name="revert", code=GOOD), tool_call("finish", "m")),
    ]


@pytest.mark.timeout(240)
def test_search_accepts_the_better_candidate_and_rejects_broken_ones(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    with ScriptedProposerServerDouble(_script()) as proposer_srv:
        _request(store, _spec(proposer_srv.base_url), iterations=4)
        policy = DigitSayerPolicyDouble()
        result = run_search(store, RUN, PHASE, client=policy, settings=SETTINGS)

    # accepted: the candidate that really changes behaviour
    assert result.accepted_candidate == "i02-c1"
    assert result.accepted_score == 1.0
    assert result.iterations == 4 and result.stopped_by == "iterations"
    assert store.read_text(result.accepted_harness) == GOOD
    assert result.accepted_harness == layout.harness_key(RUN, "c01-accepted")

    archive = Archive(store, layout.archive_prefix(RUN, 1))
    c = {cand.id: cand for cand in archive.candidates()}
    assert c["i01-incoming"].status is Status.SCORED and c["i01-incoming"].score == 0.0
    assert c["i02-c1"].status is Status.SCORED and c["i02-c1"].rollouts == 2 + 6
    assert c["i02-c1"].rationale.startswith("Replies name the digit")
    assert c["i02-c2"].status is Status.INVALID and "[syntax]" in c["i02-c2"].error
    assert c["i02-c3"].status is Status.INVALID and "[forbidden-import]" in c["i02-c3"].error
    assert c["i03-c1"].status is Status.SMOKE_FAILED and "did not answer within" in c["i03-c1"].error
    assert c["i03-c2"].status is Status.INVALID and "[hook-signature]" in c["i03-c2"].error
    assert c["i03-c3"].status is Status.SMOKE_FAILED
    assert c["i04-c1"].status is Status.DUPLICATE and c["i04-c1"].same_as == "i02-c1"
    # broken candidates never reach the full evaluation: at most the smoke items, none for invalid ones
    for cid in ("i03-c1", "i03-c3"):
        assert 0 < c[cid].rollouts <= 2
        assert not store.exists(archive.candidate_key(cid, "traces.jsonl"))
        assert store.exists(archive.candidate_key(cid, "error.txt"))
    assert c["i02-c2"].rollouts == c["i02-c3"].rollouts == c["i03-c2"].rollouts == c["i04-c1"].rollouts == 0

    # the proposer double really saw the archive: the summary and the failing traces
    seen = "\n".join(proposer_srv.tool_results())
    assert "Best so far: i01-incoming" in seen
    assert "The digit is" in seen and '"reward": 0.0' in seen
    assert any("Use the tools" in m.get("content", "") for r in proposer_srv.requests for m in r["messages"])

    # metrics: one line per iteration, the best score rises when the good candidate lands
    lines = store.read_jsonl(layout.metrics_key(RUN, PHASE))
    assert [m["iteration"] for m in lines] == [1, 2, 3, 4]
    assert [m["bestScore"] for m in lines] == [0.0, 1.0, 1.0, 1.0]
    assert [m["bestCandidate"] for m in lines] == ["i01-incoming", "i02-c1", "i02-c1", "i02-c1"]
    assert sum(m["rollouts"] for m in lines) == result.rollouts
    assert lines[0]["rollouts"] == 6
    # the accepted harness per iteration (mh_only evaluates each new one): its file in the archive
    assert [m["bestHarness"] for m in lines] == [
        archive.candidate_key(cid, "harness.py") for cid in ("i01-incoming", "i02-c1", "i02-c1", "i02-c1")
    ]
    assert [(a.iteration, a.candidate, a.score, a.rollouts) for a in result.accepted_by_iteration] == [
        (1, "i01-incoming", 0.0, 6),
        (2, "i02-c1", 1.0, lines[0]["rollouts"] + lines[1]["rollouts"]),
    ]
    assert store.read_text(result.accepted_by_iteration[-1].harness) == GOOD
    assert store.read_json(layout.result_key(RUN, PHASE))["acceptedByIteration"][1]["candidate"] == "i02-c1"
    summary = store.read_json(archive.key("summary.json"))
    assert summary["best"] == "i02-c1" and len(summary["candidates"]) == 8
    assert store.read_json(archive.iteration_key(2))["proposals"] == ["extract_digit", "broken_syntax", "shell_out"]
    assert store.exists(archive.key("README.md"))

    # resume after a kill during iteration 4's evaluation: nothing evaluated is run again, and the
    # proposer is not asked again for an iteration it already answered
    store.delete(layout.result_key(RUN, PHASE))
    store.write_text(
        layout.metrics_key(RUN, PHASE), "".join(__import__("json").dumps(m, sort_keys=True) + "\n" for m in lines[:3])
    )
    archive.put(c["i04-c1"].with_(status=Status.PENDING, same_as=None, score=None))
    with ScriptedProposerServerDouble([]) as idle_srv:
        spec = _spec(idle_srv.base_url)
        _request(store, spec, iterations=4)
        policy2 = DigitSayerPolicyDouble()
        again = run_search(store, RUN, PHASE, client=policy2, settings=SETTINGS)
        assert idle_srv.requests == []
    assert policy2.calls == 0
    assert again.accepted_candidate == "i02-c1" and again.rollouts == result.rollouts
    assert again.accepted_by_iteration == result.accepted_by_iteration
    assert [m["iteration"] for m in store.read_jsonl(layout.metrics_key(RUN, PHASE))] == [1, 2, 3, 4]


@pytest.mark.timeout(120)
def test_prompt_only_refuses_code_changes_and_adaptive_rule_stops(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    prompt_change = re.sub(
        r'SYSTEM_PROMPT = ".*"', 'SYSTEM_PROMPT = "Reply with the digit inside <answer></answer>."', _h0(), count=1
    )
    assert prompt_change != _h0()
    script = [
        assistant(
            tool_call("write_candidate", "a", name="prompt", code=prompt_change),
            tool_call("write_candidate", "b", name="code", code=GOOD),
            tool_call("finish", "c"),
        ),
    ]
    with ScriptedProposerServerDouble(script, fail_first=1) as srv:  # a 503 first: the client retries
        _request(
            store,
            _spec(srv.base_url, prompt_only=True),
            iterations=10,
            stop_rule=HarnessStopRule(min_iterations=2, patience=1, max_iterations=10),
        )
        result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    c = {cand.id: cand for cand in Archive(store, layout.archive_prefix(RUN, 1)).candidates()}
    assert c["i02-c1"].status is Status.SCORED
    assert c["i02-c2"].status is Status.INVALID and "[prompt-only]" in c["i02-c2"].error
    # no improvement in iteration 2 → patience 1 fires after iteration 2 (min 2)
    assert result.stopped_by == "patience" and result.iterations == 2
    assert result.accepted_candidate == "i01-incoming"
    assert len(store.read_jsonl(layout.metrics_key(RUN, PHASE))) == 2


@pytest.mark.timeout(120)
def test_stop_request_ends_the_phase_cleanly(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    with ScriptedProposerServerDouble([]) as srv:
        _request(store, _spec(srv.base_url), iterations=5)
        store.write_text(layout.stop_key(RUN, PHASE), "")
        result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
        assert srv.requests == []
    assert result.stopped_by == "stop-request" and result.iterations == 1
    assert store.exists(layout.result_key(RUN, PHASE))


@pytest.mark.timeout(180)
def test_a_stop_on_resume_accepts_only_from_finished_iterations(tmp_path: Path):
    """Killed after iteration 2's candidates were scored but before its metrics line, then stopped on
    resume: the phase ends after iteration 1, so its result must not accept an iteration-2 candidate that
    no metrics line (and no mh_only evaluation) ever named."""
    store = open_store(str(tmp_path / "store"))
    script = [assistant(tool_call("write_candidate", "a", name="extract_digit", code=GOOD), tool_call("finish", "b"))]
    with ScriptedProposerServerDouble(script) as srv:
        _request(store, _spec(srv.base_url), iterations=2)
        first = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert first.accepted_candidate == "i02-c1"
    lines = store.read_jsonl(layout.metrics_key(RUN, PHASE))
    store.delete(layout.result_key(RUN, PHASE))
    store.write_text(layout.metrics_key(RUN, PHASE), __import__("json").dumps(lines[0]) + "\n")
    store.write_text(layout.stop_key(RUN, PHASE), "adaptive patience fired\n")
    with ScriptedProposerServerDouble([]) as idle:
        _request(store, _spec(idle.base_url), iterations=2)
        again = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert (again.stopped_by, again.iterations) == ("stop-request", 1)
    assert again.accepted_candidate == "i01-incoming"
    assert [a.candidate for a in again.accepted_by_iteration] == ["i01-incoming"]


class DeadInferenceDouble(DigitSayerPolicyDouble):
    """Every request fails, as when the model server is down."""

    async def chat(self, *args, **kwargs):
        from whale.inference.base import InferenceError

        raise InferenceError("connection refused by the inference server double")


@pytest.mark.timeout(120)
def test_dead_inference_fails_the_phase_and_a_retry_recovers(tmp_path: Path):
    from whale.metaharness.loop import SearchError

    store = open_store(str(tmp_path / "store"))
    with ScriptedProposerServerDouble([]) as srv:
        _request(store, _spec(srv.base_url), iterations=1)
        with pytest.raises(SearchError, match="every episode of the incoming harness failed"):
            run_search(store, RUN, PHASE, client=DeadInferenceDouble(), settings=SETTINGS)
        assert not store.exists(layout.result_key(RUN, PHASE))
        assert store.read_jsonl(layout.metrics_key(RUN, PHASE)) == []
        result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert result.accepted_candidate == "i01-incoming" and result.accepted_score == 0.0
