"""A candidate harness for the synthetic domain: h0 (its prompt unchanged), but accept the last digit when the answer
tag is malformed."""

import re

from whale.harness.api import BaseHarness, env_action

ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to repeat the digit 3, reply <answer>3</answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        tagged = ANSWER_TAG.findall(text)
        digits = re.findall(r"\d", text)
        answer = tagged[-1] if tagged else (digits[-1] if digits else "")
        return env_action(f"<answer>{answer}</answer>")
