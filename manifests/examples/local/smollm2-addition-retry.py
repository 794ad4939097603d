"""A candidate harness for the synthetic addition task (SmolLM2 example): ask again when the tag is missing.

A reply without the <answer></answer> tag scores 0 under h0. Keep h0's prompt; when a reply has no tag, send one
format retry that repeats the required form (two model calls at most); the model writes every answer itself."""

import re

from whale.harness.api import BaseHarness, env_action

ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to add 20 and 30, reply <answer>50</answer>."
    USER_TEMPLATE = "{question} Answer inside <answer></answer>."
    MAX_TURNS = 2
    MAX_FORMAT_RETRIES = 1
    FORMAT_RETRY_MESSAGE = "Reply with only the sum in digits inside <answer></answer>."

    def parse_action(self, text, state):
        return env_action(text) if ANSWER_TAG.search(text) else None
