"""h0 for math_reasoning: the paper's deliberately plain base harness.

No system prompt; the problem followed by the answer-format line; the ``code_interpreter`` tool; at most
2 model calls. A reply that calls the tool gets the tool's result and one more model call; a reply that
calls no tool is the answer and ends the episode (h0 has no nudge: a candidate may add one). The
submitted reply is scored by its last ``\\boxed{}``.
"""

from whale.harness.api import BaseHarness, Decision, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = ""
    USER_TEMPLATE = "{problem}\nThe answer format must be: \\boxed{{'The final answer goes here.'}}"
    MAX_TURNS = 2
    MAX_FORMAT_RETRIES = 0
    FORMAT_RETRY_MESSAGE = "Provide the final answer in \\boxed{}."
    TOOLS = [
        {
            "type": "function",
            "function": {
                "name": "code_interpreter",
                "description": "Run Python code and return what it prints.",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "the Python source to run"}},
                    "required": ["code"],
                },
            },
        }
    ]

    def parse(self, reply, state):
        state["turn"] = state.get("turn", 0) + 1
        if reply.get("tool_calls") and state["turn"] < self.MAX_TURNS:
            return super().parse(reply, state)  # the model's tool calls become tool actions
        # no tool call (or the last turn): this reply is the answer, and the episode ends here
        return Decision(actions=[env_action(reply.get("content") or "")])
