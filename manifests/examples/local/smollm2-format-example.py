"""A candidate harness for the synthetic domain (SmolLM2 example): show the answer format by example.

Traces show SmolLM2 ignoring the instruction "Answer inside <answer></answer>" (no reply has the tag). Put
one worked example of the exact reply into the system prompt and ask for nothing else; the reply is
submitted as it is, so only replies that really use the tag score."""

from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = (
        "You repeat digits. Reply with the digit inside <answer></answer> and nothing else.\n"
        "Example: for 'Repeat the digit 3.' the reply is <answer>3</answer>"
    )
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        return env_action(text)
