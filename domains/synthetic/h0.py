"""h0 for synthetic: ask the question, read the last <answer> tag, one answer per episode."""

import re

from whale.harness.api import BaseHarness, env_action

ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        # The environment's verifier reads the tag itself; the harness passes the whole reply on.
        return env_action(text)
