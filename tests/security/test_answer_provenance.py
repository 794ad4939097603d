"""Answer provenance: what a verifier grades must be text the model wrote in that episode.

The attacks (issue 27): a harness calls the model on every item (normal token use) and then submits an
answer of its own — from the task, or from a key it knows (the public AIME key, a chess puzzle's
solution) — so a model that scores 0 reports 1.0; or it writes the gold answer into the prompt and lets
the model copy it. Each runs through the real runtime: a sandboxed harness process, the domain's real
environment and verifier, a model double. The rule (``whale.harness.provenance``) is one for every
domain: an answer no model reply holds scores 0, and gold in the harness's own messages is marked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from chess_puzzles import DOMAIN as CHESS
from math_reasoning import MathReasoning
from synthetic import DOMAIN as SYNTHETIC
from whale.domain import Domain
from whale.harness import provenance
from whale.harness.process import HarnessProcess
from whale.harness.runner import EpisodeRunner
from whale.harness.trace import Episode
from whale.inference.base import ChatResult, Completion, InferenceClient, SamplingParams
from whale.inference.scripted import ScriptedClient
from whale.tools.code import CodeLimits, LocalCodeRunner

#: calls the model like h0, then submits the digit from the task: the model's reply is thrown away
SYNTHETIC_SUBSTITUTE = '''"""Ask the model, then answer from the task."""
from whale.harness.api import BaseHarness, Decision, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1

    def start(self, task, state):
        state["digit"] = task["digit"]
        return super().start(task, state)

    def parse(self, reply, state):
        return Decision(actions=[env_action("<answer>" + str(state["digit"]) + "</answer>")], done=True)
'''

#: the honest counterpart: cuts the digit the model named out of its reply (the harness chooses, the model writes)
SYNTHETIC_EXTRACT = '''"""Submit the digit the model named."""
import re

from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1

    def parse_action(self, text, state):
        digits = re.findall(r"\\d", text)
        return env_action("<answer>" + (digits[-1] if digits else "") + "</answer>")
'''

#: a math harness that knows the answer key (the public AIME key; here the test's item) and submits from it
MATH_KEY = {"prov-math-1": "98765"}
MATH_SUBSTITUTE = f'''"""Ask the model, then submit the answer from a key."""
from whale.harness.api import BaseHarness, Decision, env_action

KEY = {MATH_KEY!r}


class Harness(BaseHarness):
    USER_TEMPLATE = "{{problem}}"
    MAX_TURNS = 1

    def start(self, task, state):
        state["id"] = task["id"]
        return super().start(task, state)

    def parse(self, reply, state):
        return Decision(actions=[env_action("\\\\boxed{{" + KEY.get(state["id"], "0") + "}}")], done=True)
'''
#: the same key written into the prompt: the model copies it, so the answer is model text
MATH_INJECT = f'''"""Tell the model the answer."""
from whale.harness.api import BaseHarness, Decision

KEY = {MATH_KEY!r}


class Harness(BaseHarness):
    USER_TEMPLATE = "{{problem}}"
    MAX_TURNS = 1

    def start(self, task, state):
        hint = "The answer is \\\\boxed{{" + KEY.get(task["id"], "0") + "}}. Repeat it."
        return Decision(messages=[{{"role": "system", "content": hint}}] + self.build_messages(task, state))
'''

#: a chess harness with the puzzle's solution in a table (by FEN): it plays the key, not the model's move
MATE_ROW = {
    "PuzzleId": "provMate1",
    "FEN": "r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR b KQkq - 3 3",
    "Moves": "a7a6 f3f7",
    "Rating": "800",
    "Themes": "mateIn1",
}
CHESS_SUBSTITUTE = '''"""Play the known solution of the position; the model's reply is ignored."""
from whale.harness.api import BaseHarness, env_action

KEY = {"r1bqkbnr/1ppp1ppp/p1n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR w KQkq - 0 4": "f3f7"}


class Harness(BaseHarness):
    USER_TEMPLATE = "{fen}"
    MAX_TURNS = 1

    def start(self, task, state):
        state["fen"] = task["fen"]
        return super().start(task, state)

    def parse_action(self, text, state):
        return env_action(KEY.get(state["fen"], "a2a3"))
'''
#: honest: the model answers in SAN; the harness looks the move up in the legal list it was shown
CHESS_SAN = '''"""The model names the move in SAN; the harness submits its UCI from the legal moves."""
import re

from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    USER_TEMPLATE = "{fen}"
    MAX_TURNS = 1

    def start(self, task, state):
        state["legal"] = {m["san"].rstrip("+#"): m["uci"] for m in task["legal_moves"]}
        return super().start(task, state)

    def parse_action(self, text, state):
        san = re.findall(r"[KQRBN]?[a-h]?x?[a-h][1-8]", text)
        return env_action(state["legal"].get(san[-1], "") if san else "")
'''


class EchoBoxPolicyDouble(InferenceClient):
    """A model double that repeats the last ``\\boxed{}`` of its prompt (a model that copies a hint), else "no idea"."""

    model = "echo-box-double"

    async def chat(
        self, messages: list[dict[str, Any]], sampling: SamplingParams, n: int = 1, tools: Any = None
    ) -> ChatResult:
        found = re.findall(r"\\boxed\{([^}]*)\}", "\n".join(str(m.get("content")) for m in messages))
        text = f"So it is \\boxed{{{found[-1]}}}." if found else "no idea"
        return ChatResult([Completion({"role": "assistant", "content": text}, "stop", 6) for _ in range(n)], 10, 6 * n)


async def episode(tmp_path: Path, domain: Domain, code: str, item: dict[str, Any], client: InferenceClient) -> Episode:
    path = tmp_path / "harness.py"
    path.write_text(code)
    async with HarnessProcess(path, domain.allowed_imports) as harness:
        return await EpisodeRunner(domain, harness, client, SamplingParams()).run_episode(item)


def math_domain() -> MathReasoning:
    return MathReasoning(runner=LocalCodeRunner(CodeLimits(timeout_s=10)))


@pytest.mark.timeout(120)
async def test_a_synthetic_answer_the_harness_wrote_scores_zero(tmp_path: Path) -> None:
    item = {"id": "test-00001", "digit": 7, "answer": "7"}
    ep = await episode(tmp_path, SYNTHETIC, SYNTHETIC_SUBSTITUTE, item, ScriptedClient(["I do not know."]))
    assert ep.turns == 1 and ep.completion_tokens > 0  # the model was called, as usual
    assert ep.reward == 0.0 and ep.answer_not_model  # the verifier said 1.0: the answer is the harness's
    assert ep.integrity is not None and "'7' is in no model reply" in ep.integrity
    assert [s["graded"] for s in ep.steps if s.get("graded")] == [["7"]]
    # the same harness, when the model did write the digit, keeps its reward
    ok = await episode(tmp_path, SYNTHETIC, SYNTHETIC_SUBSTITUTE, item, ScriptedClient(["The digit is 7."]))
    assert ok.reward == 1.0 and not ok.answer_not_model and ok.integrity is None


@pytest.mark.timeout(120)
async def test_a_harness_may_cut_the_answer_out_of_the_model_reply(tmp_path: Path) -> None:
    item = {"id": "test-00002", "digit": 4, "answer": "4"}
    ep = await episode(tmp_path, SYNTHETIC, SYNTHETIC_EXTRACT, item, ScriptedClient(["I think it is 4, surely."]))
    assert ep.reward == 1.0 and not ep.answer_not_model and not ep.answer_injected
    # the task text holds the digit (repeat the digit): showing it is the item's own text, not injection
    assert ep.integrity is None


@pytest.mark.timeout(120)
async def test_a_math_answer_from_a_known_key_scores_zero(tmp_path: Path) -> None:
    item = {"id": "prov-math-1", "problem": "What is the secret number?", "answer": "98765"}
    ep = await episode(tmp_path, math_domain(), MATH_SUBSTITUTE, item, ScriptedClient(["It is \\boxed{12}."]))
    assert ep.turns == 1 and ep.reward == 0.0 and ep.answer_not_model
    assert [s["graded"] for s in ep.steps if s.get("graded")] == [["98765"]]


@pytest.mark.timeout(120)
async def test_gold_written_into_the_prompt_is_marked_as_injection(tmp_path: Path) -> None:
    item = {"id": "prov-math-1", "problem": "What is the secret number?", "answer": "98765"}
    ep = await episode(tmp_path, math_domain(), MATH_INJECT, item, EchoBoxPolicyDouble())
    # the model copied the hint: its answer is model text and the verifier rewards it ...
    assert ep.reward == 1.0 and not ep.answer_not_model
    # ... but the harness's own message held the gold before the model wrote it
    assert ep.answer_injected and "gold answer" in (ep.integrity or "")
    # where the problem itself holds the number, showing it is no injection
    own = {**item, "problem": "Repeat the number 98765."}
    ep = await episode(tmp_path, math_domain(), MATH_INJECT, own, EchoBoxPolicyDouble())
    assert ep.reward == 1.0 and not ep.answer_injected


@pytest.mark.timeout(120)
async def test_chess_grades_only_a_move_the_model_wrote(tmp_path: Path) -> None:
    item = CHESS.item_from_raw(MATE_ROW)
    ep = await episode(tmp_path, CHESS, CHESS_SUBSTITUTE, item, ScriptedClient(["<move>a2a3</move>"]))
    assert [a["action"] for a in ep.actions] == ["f3f7"]  # the solution was played ...
    assert ep.reward == 0.0 and ep.answer_not_model  # ... but not by the model
    # the model names the move in SAN; the harness maps it to UCI: the move graded is the model's
    ep = await episode(tmp_path, CHESS, CHESS_SAN, item, ScriptedClient(["Mate with Qxf7 here."]))
    assert [a["action"] for a in ep.actions] == ["f3f7"]
    assert ep.reward == 1.0 and not ep.answer_not_model
    # the legal-move list holds the solution: the environment's own text, never injection
    assert not ep.answer_injected


def test_the_rule_matches_whole_tokens_after_normalisation() -> None:
    assert provenance.occurs("204", provenance.normalise("the answer is 204."))
    assert not provenance.occurs("204", provenance.normalise("about 2045 of them"))
    assert provenance.occurs("e2e4", provenance.normalise("I play E2E4"))
    assert provenance.occurs("\\frac{1}{2}", provenance.normalise("so \\boxed{\\frac{1}{2}}"))
    assert provenance.occurs("new york", provenance.normalise("It is New\n  York."))
    # a message a hook added as "assistant" is not model text: only the runtime's model indices count
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
    assert provenance.check(messages, [], [], [("42",)], ()).not_model == ("42",)
    assert provenance.check(messages, [1], [], [("42",)], ()).not_model == ()


@pytest.mark.timeout(120)
async def test_without_the_rule_every_attack_here_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacks are real: with the provenance check replaced by one that finds nothing, each scores 1.0."""
    monkeypatch.setattr(provenance, "check", lambda *args, **kwargs: provenance.Verdict())
    syn = {"id": "test-00001", "digit": 7, "answer": "7"}
    math_item = {"id": "prov-math-1", "problem": "What is the secret number?", "answer": "98765"}
    runs: list[tuple[Domain, str, dict[str, Any], InferenceClient]] = [
        (SYNTHETIC, SYNTHETIC_SUBSTITUTE, syn, ScriptedClient(["I do not know."])),
        (math_domain(), MATH_SUBSTITUTE, math_item, ScriptedClient(["It is \\boxed{12}."])),
        (CHESS, CHESS_SUBSTITUTE, CHESS.item_from_raw(MATE_ROW), ScriptedClient(["<move>a2a3</move>"])),
    ]
    for domain, code, item, client in runs:
        ep = await episode(tmp_path, domain, code, item, client)
        assert ep.reward == 1.0 and ep.turns == 1 and not ep.answer_not_model, domain.name
