"""h0 for synthetic: ask the question with one worked reply (the tag's format), one answer per episode.

The worked reply is what lets a small instruction-tuned model (SmolLM2-135M, docs/local.md) write the tag at all
(about 15 % of its replies; with the bare instruction none did), so RSFT has something to keep from the first step."""

import re

from whale.harness.api import BaseHarness, env_action

ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to repeat the digit 3, reply <answer>3</answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        # The environment's verifier reads the tag itself; the harness passes the whole reply on.
        return env_action(text)
