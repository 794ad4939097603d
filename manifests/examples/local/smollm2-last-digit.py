"""A candidate harness for the synthetic domain (SmolLM2 example): read the answer from the reply's words.

Traces show SmolLM2 answering the right digit in plain words ("The answer is 7.") and, most of the time, not
writing the <answer></answer> tag the verifier reads, even with h0's worked reply in the prompt. Keep h0's prompt;
when the tag is missing, submit the last digit of the reply in the tag; the model still has to say the digit."""

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
