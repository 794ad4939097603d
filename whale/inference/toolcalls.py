"""Tool calls written as text, turned into an OpenAI assistant message, in the two formats vLLM's
tool-call parsers read for the models we serve:

* ``hermes`` (Qwen2.5/Qwen3 chat templates): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* ``qwen3_coder`` (Qwen3-Coder templates; vLLM ``--tool-call-parser qwen3_coder``)::

      <tool_call>
      <function=NAME>
      <parameter=ARG>
      VALUE
      </parameter>
      </function>
      </tool_call>

  A VALUE is text; it is converted by the tool's JSON schema type when the tools are known (as vLLM
  does: integer, number, boolean, object/array as JSON, ``null``), else kept as a string.

Shared by the in-process backend (parsing generated text) and the scripted client (``whale replay``
replies), so a scripted reply is understood exactly as a generated one would be. A block that reads
in neither format is skipped; a text without a readable call stays plain text. No torch.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FUNCTION_RE = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)

#: the parsers known here (vLLM's names); "auto" reads each block in whichever format it is written
PARSERS = ("auto", "hermes", "qwen3_coder")


def parser_for_template(chat_template: str | None) -> str:
    """The parser a chat template's tool calls need: ``qwen3_coder`` when the template writes
    ``<function=...>`` blocks, else ``hermes``."""
    return "qwen3_coder" if chat_template and "<function=" in chat_template else "hermes"


def parse_tool_calls(
    text: str, parser: str = "auto", tools: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """``<tool_call>`` blocks -> OpenAI ``tool_calls`` (malformed blocks are skipped)."""
    if parser not in PARSERS:
        raise ValueError(f"unknown tool-call parser {parser!r}; known: {', '.join(PARSERS)}")
    calls: list[dict[str, Any]] = []
    for block in TOOL_CALL_RE.findall(text):
        coder = block.startswith("<function=")
        if parser == "qwen3_coder" or (parser == "auto" and coder):
            found = _qwen3_coder_calls(block, _parameter_types(tools))
        elif coder:
            found = []
        else:
            found = _hermes_call(block)
        calls.extend(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for name, arguments in found
        )
    return calls


def assistant_message(text: str, parser: str = "auto", tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The assistant message a server with a tool-call parser returns for generated ``text``."""
    calls = parse_tool_calls(text, parser, tools)
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text[: text.find("<tool_call>")].strip(), "tool_calls": calls}


def _hermes_call(block: str) -> list[tuple[str, str]]:
    try:
        payload = json.loads(block)
    except ValueError:
        return []
    if not isinstance(payload, dict) or "name" not in payload:
        return []
    arguments = payload.get("arguments", {})
    return [(str(payload["name"]), arguments if isinstance(arguments, str) else json.dumps(arguments))]


def _qwen3_coder_calls(block: str, types: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    calls = []
    for name, body in _FUNCTION_RE.findall(block):
        name = name.strip()
        if not name:
            continue
        arguments = {}
        for arg, raw in _PARAMETER_RE.findall(body):
            arg = arg.strip()
            if arg:
                arguments[arg] = _convert(_strip_one_newline(raw), types.get(name, {}).get(arg))
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    return calls


def _strip_one_newline(value: str) -> str:
    """The template puts the value on its own lines; the newline on each side is not part of it."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _parameter_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, str]]:
    """{function name: {parameter: JSON schema type}} from OpenAI tool schemas."""
    types: dict[str, dict[str, str]] = {}
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        properties = ((function.get("parameters") or {}).get("properties") or {}) if isinstance(function, dict) else {}
        if isinstance(properties, dict):
            types[str(function.get("name"))] = {
                arg: str(schema.get("type", "string")) if isinstance(schema, dict) else "string"
                for arg, schema in properties.items()
            }
    return types


def _convert(value: str, kind: str | None) -> Any:
    """A parameter's text -> the JSON value its schema type says (the text itself when it does not read)."""
    if kind is None or kind == "string":
        return value
    text = value.strip()
    if text.lower() == "null":
        return None
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            number = float(text)
            return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
        if kind == "boolean":
            return {"true": True, "false": False}.get(text.lower(), value)
        try:
            return json.loads(text)
        except ValueError:
            return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value
