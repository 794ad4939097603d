"""A candidate harness for the synthetic addition task (SmolLM2 example): show the answer format by example.

The instruction with one worked reply is mostly ignored. Say what the task is, ask for the sum in the tag and
nothing else, and give one whole question and reply as the example; the reply is submitted as it is, so only
replies that really use the tag score."""

from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = (
        "You add two numbers. Reply with the sum in digits inside <answer></answer> and nothing else.\n"
        "Example: for 'What is 20 + 30?' the reply is <answer>50</answer>"
    )
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        return env_action(text)
