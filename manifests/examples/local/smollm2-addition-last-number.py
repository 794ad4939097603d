"""A candidate harness for the synthetic addition task (SmolLM2 example): read the sum from the reply's words.

A 135M model asked "What is 3 + 5?" often states the sum in prose ("3 + 5 = 8.") without the <answer></answer>
tag the verifier reads, even with h0's worked reply in the prompt. Keep h0's prompt; when the tag is missing, submit
the last number of the reply in the tag; the model still has to compute the sum."""

import re

from whale.harness.api import BaseHarness, env_action

ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to add 20 and 30, reply <answer>50</answer>."
    USER_TEMPLATE = "{question} Answer inside <answer></answer>."
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        tagged = ANSWER_TAG.findall(text)
        numbers = re.findall(r"\d+", text)
        answer = tagged[-1] if tagged else (numbers[-1] if numbers else "")
        return env_action(f"<answer>{answer}</answer>")
