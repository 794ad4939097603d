"""h0 for synthetic's addition task (``spec.experiment.domainOptions.syntheticTask: addition``): ask the question with one worked reply
(the tag's format) and the instruction again after it, one answer per episode.

The repeat task's h0 with an addition as its worked reply, and the instruction repeated after the question: with the
worked reply in the system prompt alone, SmolLM2-135M (docs/local.md) wrote the tag in none of 64 replies; with the
instruction after the question too, in some (8 % of 64, mostly copying the example's sentence with a wrong sum).
The example's numbers (20, 30, 50) are none of the task's answers (0-18): a prompt number that is an item's answer
counts as the harness telling the model the answer (the answer-injection check, whale.metaharness.integrity)."""

import re

from whale.harness.api import BaseHarness, env_action

ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to add 20 and 30, reply <answer>50</answer>."
    USER_TEMPLATE = "{question} Answer inside <answer></answer>."
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        # The environment's verifier reads the tag itself; the harness passes the whole reply on.
        return env_action(text)
