"""h0 for synthetic's addition task (``spec.data.syntheticTask: addition``): ask the question with one worked reply
(the tag's format) and the instruction again after it, one answer per episode.

The repeat task's h0 with an addition as its worked reply, and the instruction repeated after the question: with the
worked reply in the system prompt alone, SmolLM2-135M (docs/local.md) wrote the tag in none of 64 replies; with the
instruction after the question too, in about one in five (mostly copying the example's 4)."""

import re

from whale.harness.api import BaseHarness, env_action

ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to add 2 and 2, reply <answer>4</answer>."
    USER_TEMPLATE = "{question} Answer inside <answer></answer>."
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        # The environment's verifier reads the tag itself; the harness passes the whole reply on.
        return env_action(text)
