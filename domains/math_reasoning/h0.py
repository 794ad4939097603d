"""h0 for math_reasoning: the paper's deliberately plain base harness.

No system prompt; the problem followed by the answer-format line; the ``code_interpreter`` tool; at most
2 model calls. A first reply that calls no tool gets a nudge to use it; the final reply is submitted as
the answer and scored by its last ``\\boxed{}``.
"""

from whale.harness.api import BaseHarness, Decision, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = ""
    USER_TEMPLATE = "{problem}\nThe answer format must be: \\boxed{{'The final answer goes here.'}}"
    MAX_TURNS = 2
    MAX_FORMAT_RETRIES = 0
    FORMAT_RETRY_MESSAGE = "Provide the final answer in \\boxed{}."
    NUDGE = (
        "Use the code_interpreter tool for useful calculations or verification, "
        "then provide the final answer in \\boxed{}."
    )
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
        last_turn = state["turn"] >= self.MAX_TURNS
        if not last_turn:
            if reply.get("tool_calls"):
                state["tool_used"] = True
                return super().parse(reply, state)  # the model's tool calls become tool actions
            if not state.get("tool_used"):
                return Decision(messages=[{"role": "user", "content": self.NUDGE}])
        return Decision(actions=[env_action(reply.get("content") or "")])
