"""h0 for search_qa: the paper's deliberately plain base harness.

System "Answer factual questions using search when needed."; the question with the ``<answer>`` format
line; the ``search`` tool, but every call is forced to one query, the top-1 passage, cut to 200 tokens;
at most 2 model calls. The final reply is submitted as the answer and scored by its last ``<answer>``.
"""

from whale.harness.api import BaseHarness, Decision, env_action, tool_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer factual questions using search when needed."
    USER_TEMPLATE = (
        "Question: {question}\nUse the search tool if needed. Put the final answer only inside <answer>...</answer>."
    )
    MAX_TURNS = 2
    MAX_FORMAT_RETRIES = 0
    FORMAT_RETRY_MESSAGE = "Put the final answer only inside <answer>...</answer>."
    TOPK = 1
    MAX_DOC_TOKENS = 200
    TOOLS = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Searches for relevant information and returns exactly one passage.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query_list": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "A list containing exactly one semantic query.",
                        },
                        "topk": {"type": "integer", "description": "Ignored: always 1."},
                    },
                    "required": ["query_list"],
                },
            },
        }
    ]

    def parse(self, reply, state):
        state["turn"] = state.get("turn", 0) + 1
        if reply.get("tool_calls") and state["turn"] < self.MAX_TURNS:
            forced = []
            for action in super().parse(reply, state)["actions"]:
                args = action.get("arguments") or {}
                queries = args.get("query_list")
                if isinstance(queries, str):
                    queries = [queries]
                first = [str(queries[0])] if isinstance(queries, list) and queries else queries
                forced.append(
                    tool_action(
                        action.get("name") or "",
                        {
                            "query_list": first,
                            "topk": self.TOPK,
                            "max_doc_tokens": self.MAX_DOC_TOKENS,
                        },
                        action.get("id"),
                    )
                )
            return Decision(actions=forced)
        return Decision(actions=[env_action(reply.get("content") or "")])
