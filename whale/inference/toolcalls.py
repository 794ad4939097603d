"""Tool calls written as text (hermes style, what Qwen-family chat templates generate):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, turned into an OpenAI assistant message.
Shared by the in-process backend (parsing generated text) and the scripted client (``whale replay``
replies), so a scripted reply is understood exactly as a generated one would be. No torch."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """Hermes-style ``<tool_call>`` blocks -> OpenAI ``tool_calls`` (malformed blocks are skipped)."""
    calls = []
    for raw in TOOL_CALL_RE.findall(text):
        try:
            payload = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(payload, dict) or "name" not in payload:
            continue
        arguments = payload.get("arguments", {})
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": str(payload["name"]),
                         "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
        })
    return calls


def assistant_message(text: str) -> dict[str, Any]:
    """The assistant message a server with a tool-call parser returns for generated ``text``."""
    calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text[: text.find("<tool_call>")].strip(), "tool_calls": calls}
