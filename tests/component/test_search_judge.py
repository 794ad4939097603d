"""The LLM-judge option of the search-QA verifier (``spec.experiment.domainOptions.searchAnswer: llmJudge``; default EM).

Against the tiny real model behind the project's OpenAI-compatible server (it answers gibberish, so every
attempt is unreadable and the score falls back to exact match, as the reference's judge does), and against
``ScriptedJudgeDouble``, a chat endpoint whose verdicts each test scripts (no judge model runs here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request

from search_qa import SearchQA
from search_qa.env import SearchEnvironment
from search_qa.judge import Judge, judge_prompt, parse_verdict
from search_qa.verifier import judged_answer, judged_score, last_answer, score
from whale.core.spec import Verifier
from whale.domain import DomainError, Retriever

QUESTION = "Who wrote the novel Moby-Dick?"
GOLD = ["Herman Melville"]


class ScriptedJudgeDouble:
    """Test double of a judge endpoint: answers the scripted replies in order (then CORRECT), records requests."""

    def __init__(self) -> None:
        self.replies: list[str] = []
        self.requests: list[tuple[dict[str, Any], str | None]] = []
        self.url = ""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> dict[str, Any]:
            self.requests.append((await request.json(), request.headers.get("authorization")))
            content = self.replies.pop(0) if self.replies else "CORRECT"
            return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}

        return app


@pytest.fixture(scope="module")
def judge_double() -> Iterator[ScriptedJudgeDouble]:
    from whale.inference.server import serve_in_thread

    double = ScriptedJudgeDouble()
    with serve_in_thread(double.app()) as url:
        double.url = url
        yield double


def test_verdicts_are_the_first_word_and_the_prompt_names_question_golds_and_answer():
    assert parse_verdict("CORRECT") is True and parse_verdict("incorrect.") is False
    assert parse_verdict("**Correct** because") is True and parse_verdict("Maybe") is None and parse_verdict("") is None
    prompt = judge_prompt(QUESTION, ["Herman Melville", "Melville"], "Melville")
    assert QUESTION in prompt and "Herman Melville | Melville" in prompt and "Predicted answer: Melville" in prompt


def test_the_judge_decides_where_it_answers(judge_double):
    judge = Judge(base_url=judge_double.url, model="judge-model", api_key="k-test", backoff_s=0)
    judge_double.replies = ["CORRECT", "INCORRECT"]
    # an alias exact match refuses, the judge accepts; an exact match the judge rejects scores 0
    assert score("<answer>Melville</answer>", GOLD) == 0.0
    assert judged_score("<answer>Melville</answer>", GOLD, QUESTION, judge) == 1.0
    assert judged_score("<answer>Herman Melville</answer>", GOLD, QUESTION, judge) == 0.0
    body, auth = judge_double.requests[-1]
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_completion_tokens"] == 256
    assert auth == "Bearer k-test" and "Predicted answer: Herman Melville" in body["messages"][0]["content"]
    # no 0.25 tag-spam rule under the judge (the reference removed it there); no <answer>: 0, the judge not asked
    spam = "<answer>x</answer>" * 11 + "<answer>Herman Melville</answer>"
    asked = len(judge_double.requests)
    assert score(spam, GOLD) == 0.25 and judged_score(spam, GOLD, QUESTION, judge) == 1.0
    assert judged_score("Herman Melville", GOLD, QUESTION, judge) == 0.0 and len(judge_double.requests) == asked + 1


def test_unreadable_verdicts_are_retried_then_exact_match_stands_in(judge_double):
    pauses: list[float] = []
    judge = Judge(base_url=judge_double.url, backoff_s=1.0, sleep=pauses.append)
    judge_double.replies = ["I think so", "hmm", "INCORRECT"]
    assert judged_score("<answer>Herman Melville</answer>", GOLD, QUESTION, judge) == 0.0  # the third attempt
    assert pauses == [1.0, 2.0] and judge.failures == 2
    judge_double.replies = ["?", "?", "?"]
    assert judged_score("<answer>Herman Melville</answer>", GOLD, QUESTION, judge) == 1.0  # EM after 3 failures


def test_a_real_model_that_answers_no_verdict_falls_back_to_exact_match(tiny_model_server):
    judge = Judge(base_url=tiny_model_server, model="tiny-qwen3", attempts=2, backoff_s=0, timeout_s=120)
    assert judged_score("<answer>herman melville</answer>", GOLD, QUESTION, judge) == 1.0
    assert judged_score("<answer>Ishmael</answer>", GOLD, QUESTION, judge) == 0.0
    assert judge.failures == 4  # every attempt reached the model and came back without a verdict


def test_the_domain_builds_the_judge_from_the_spec_and_refuses_a_missing_key(judge_double, monkeypatch):
    domain = SearchQA(retriever=None)
    domain.configure_verifier(Verifier())
    assert domain.judge is None  # exact match by default, as the reference's scripts
    on = {"judge": {"baseUrl": judge_double.url, "apiKeyEnv": "TEST_JUDGE_KEY"}}
    domain = domain.with_options({"searchAnswer": "llmJudge"})
    monkeypatch.delenv("TEST_JUDGE_KEY", raising=False)
    with pytest.raises(DomainError, match=r"apiKeyEnv: \$TEST_JUDGE_KEY is not set"):
        domain.configure_verifier(Verifier.model_validate(on))
    monkeypatch.setenv("TEST_JUDGE_KEY", "k2")
    domain.configure_verifier(Verifier.model_validate(on))
    assert domain.judge is not None and domain.judge.model == "gpt-5.4-mini" and domain.judge.api_key == "k2"
    env = domain.make_env({"id": "q", "question": QUESTION, "golden_answers": GOLD})
    assert isinstance(env, SearchEnvironment)
    judge_double.replies = ["CORRECT"]
    env.step("It is <answer>Melville</answer>")
    assert env.reward() == 1.0
    assert QUESTION in judge_double.requests[-1][0]["messages"][0]["content"]


@pytest.mark.parametrize(
    ("reply", "judged", "em"),
    [
        ("<answer>Melville</answer>", "Melville", "Melville"),
        # the last </answer> pairs with the nearest <answer> before it (the reference's judge), not the first
        ("<answer>junk<answer>Melville</answer>", "Melville", "junk<answer>Melville"),
        ("<answer>Melville</answer></answer>", "Melville</answer>", "Melville"),
        ("<answer>Ahab</answer> no, <answer>Melville</answer> <answer>draft", "Melville", "Melville"),
        ("<answer> </answer>", "", ""),  # an empty pair is an answer (the judge is asked about it)
        ("</answer><answer>Melville", None, None),
        ("Melville", None, None),
        ("<ANSWER>Melville</ANSWER>", None, "Melville"),  # the judge's tags are lower case, as the reference's
    ],
)
def test_the_judge_pairs_the_answer_tags_as_the_references_judge(reply, judged, em):
    assert judged_answer(reply) == judged
    assert last_answer(reply) == em  # exact match keeps verl's EM extraction (last non-greedy pair)


def test_the_judge_is_asked_about_an_empty_answer_and_never_without_a_pair(judge_double):
    judge = Judge(base_url=judge_double.url, backoff_s=0)
    asked = len(judge_double.requests)
    judge_double.replies = ["INCORRECT"]
    assert judged_score("<answer></answer>", GOLD, QUESTION, judge) == 0.0
    assert len(judge_double.requests) == asked + 1
    assert judge_double.requests[-1][0]["messages"][0]["content"].endswith(
        "Predicted answer: \n\nReply with one word: CORRECT or INCORRECT."
    )
    judge_double.replies = ["CORRECT"]
    assert judged_score("<answer>junk<answer>Melville</answer>", GOLD, QUESTION, judge) == 1.0
    assert "Predicted answer: Melville\n" in judge_double.requests[-1][0]["messages"][0]["content"]
    assert judged_score("</answer> Melville <answer>", GOLD, QUESTION, judge) == 0.0
    assert len(judge_double.requests) == asked + 2  # no pair: 0 without asking


def no_search() -> Retriever:
    raise AssertionError("these episodes never search")


def test_under_the_judge_the_graded_answer_is_the_one_the_judge_reads(judge_double):
    judge = Judge(base_url=judge_double.url, backoff_s=0)
    item = {"id": "q", "question": QUESTION, "golden_answers": GOLD}
    reply = "<answer>junk<answer>Melville</answer>"
    assert SearchEnvironment(item, no_search, judge).step(reply).graded == ("Melville",)
    assert SearchEnvironment(item, no_search).step(reply).graded == ("junk<answer>Melville",)
