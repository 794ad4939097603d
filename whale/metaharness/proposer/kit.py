"""The proposer's prototyping kit: what the reference's skills ask the proposer to try before it writes a
candidate (call the harness's ``search()`` on a few real questions against the retriever, try its hooks on
trajectories), put into the agent's workspace as plain files.

``proto/`` in the workspace holds the harness API (``whale/harness/api.py``, standard library only, so any
``python3`` imports it with ``proto/`` on ``sys.path``), the domain's standard-library tool code
(``Domain.prototype_modules``: search_qa's ``search_qa/tool.py`` and math_reasoning's ``math_reasoning/tool.py``,
each tool's answer, the very file its environment runs, and ``whale/tools/passage_row.py``, how a retriever's row
is read), the incoming harness (``incoming.py``), the D_harness tasks as the harness sees them
(``tasks.jsonl``: ``Environment.reset()`` of each item — no gold answer, no test item), ``tools.py`` (the domain's tool services over HTTP, standard library only, at the URLs
``services.json`` lists) and ``README.md``. Only the services the harness-search workload itself reaches
are listed (their URL variables set in its environment): the agent reaches them with the network it has
for its model's API; nothing else is added (no credential, no store, no data root).

:func:`prototype_kit` is pure: the caller reads the API's source and the tasks and names the services.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

KIT_DIR = "proto"
#: tasks put into the kit at most (D_harness is 256 in every domain)
MAX_TASKS = 256
#: bytes of one task's JSON line at most (a bigger one is left out, not cut)
MAX_TASK_BYTES = 64_000

_TOOLS = '''"""The run's tool services, standard library only, answering as the harness's environment does:
``call(name, arguments)`` returns the text a model reads after that tool call, through the environment's own code
(``search``: search_qa's retriever, ``search_qa/tool.py``; ``code_interpreter``: math_reasoning's interpreter,
``math_reasoning/tool.py``); ``retrieve`` is the retriever's raw answer and ``run_code`` the interpreter's. The URLs are in services.json; a service the run has
not deployed is missing there."""

import json
import os
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICES = json.load(open(os.path.join(HERE, "services.json")))


def _url(name, path):
    if name not in SERVICES:
        raise RuntimeError(f"no {name} service in this run (services.json lists {sorted(SERVICES)})")
    return SERVICES[name].rstrip("/") + path


def _post(name, path, payload, timeout=60):
    req = urllib.request.Request(_url(name, path), json.dumps(payload).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def retrieve(query_list, topk=3, max_doc_tokens=None):
    """The retriever's raw answer: for each query, its top passages {"id", "title", "text", "contents"}."""
    payload = {"queries": list(query_list), "topk": int(topk)}
    if max_doc_tokens is not None:
        payload["max_doc_tokens"] = int(max_doc_tokens)
    return _post("retriever", "/retrieve", payload)["result"]


def _cuts_tokens():
    """Whether the retriever cuts in the policy's tokens (started with --tokenizer), as the environment asks."""
    with urllib.request.urlopen(_url("retriever", "/healthz"), timeout=60) as resp:
        about = json.loads(resp.read())
    return isinstance(about, dict) and bool(about.get("tokenizer"))


def _passages(query_list, topk, max_doc_tokens):
    from whale.tools.passage_row import passage_fields

    rows = retrieve(query_list, topk, max_doc_tokens)
    return [[passage_fields(d.get("document", d))[1:3] for d in row] for row in rows]


def call(name, arguments):
    """A tool call as a harness's action makes it ({"kind": "tool", "name": ..., "arguments": ...}): the text the
    model reads. A tool error raises ValueError with the message the model would read."""
    if name == "search":
        from search_qa.tool import answer

        return answer(dict(arguments), _passages, _cuts_tokens)
    if name == "code_interpreter":
        from math_reasoning.tool import answer

        return answer(dict(arguments), _run)
    raise ValueError(f"call: no tool {name!r} in this kit")


def _run(code):
    result = _post("sandbox", "/run", {"code": code}, timeout=150)  # the environment's client sends no timeout
    return str(result.get("output", "")), result.get("error")


def search(query_list, topk=3, max_doc_tokens=200):
    """``call("search", ...)``: the JSON {"result": "Doc 1(Title: t) text ..."} the model reads."""
    return call("search", {"query_list": list(query_list), "topk": topk, "max_doc_tokens": max_doc_tokens})


def run_code(code, timeout_s=30):
    """The code interpreter's answer for ``code`` (its status, stdout, stderr)."""
    return _post("sandbox", "/run", {"code": code, "timeout_s": timeout_s}, timeout=timeout_s * 4 + 30)
'''

_README = """# Prototyping kit

Try ideas here before you write a candidate; the outer loop still scores every candidate itself.

    cd proto && python3 -c "import tools; print(tools.search(['QUESTION'], topk=1))"

* `whale/harness/api.py` — the harness API (`from whale.harness.api import BaseHarness, Decision, ...` with
  `proto/` on `sys.path`); `incoming.py` — the harness this phase started from; import a candidate the same
  way and call its hooks (`start`, `parse`, `observe`, ...) on a task with a state dict of your own.
* `tasks.jsonl` — the D_harness tasks as a harness's `start(task, state)` gets them (no gold answers).
* `tools.py` — the run's tool services: {services}. `tools.call(name, arguments)` with a harness's tool action
  returns exactly the text the model reads after that call (`search`: the `{{"result": ...}}` JSON, passages cut to
  `max_doc_tokens` as in the episodes).
"""


_OFFLINE_README = """# Prototyping kit (offline)

Read and import these in `run_shell` (`python3` with `proto/` on `sys.path`); there is no network here, so the
run's tools are reached through the `try_harness` tool instead of `tools.py`.

* `whale/harness/api.py` — the harness API; `incoming.py` — the harness this phase started from; import a candidate
  the same way and call its hooks (`start`, `parse`, `observe`, ...) on a task with a state dict of your own.
* `tasks.jsonl` — the D_harness tasks as a harness's `start(task, state)` gets them (no gold answers); their `id`s
  are what `try_harness` takes as `items`.
"""

#: the kit's service clients: no use where the agent has no network (the built-in agents' shell)
_ONLINE_ONLY = (f"{KIT_DIR}/tools.py", f"{KIT_DIR}/services.json")


def offline_kit(files: Mapping[str, str]) -> dict[str, str]:
    """The kit for an agent without network (the built-in agents: their ``run_shell`` has none, their
    ``try_harness`` reaches the tools): the same files but the service clients, and a README saying so."""
    out = {path: text for path, text in files.items() if path not in _ONLINE_ONLY}
    if f"{KIT_DIR}/README.md" in out:
        out[f"{KIT_DIR}/README.md"] = _OFFLINE_README
    return out


def _packages(modules: Mapping[str, str]) -> dict[str, str]:
    """``modules`` (kit-relative path -> source) under the kit, with an empty ``__init__.py`` in every folder
    above each, so ``import a.b.c`` works with ``proto/`` on ``sys.path``."""
    files: dict[str, str] = {}
    for path, source in sorted(modules.items()):
        parts = PurePosixPath(path).parts
        if PurePosixPath(path).is_absolute() or ".." in parts or not path.endswith(".py"):
            raise ValueError(f"kit module {path!r}: must be a relative .py path inside the kit")
        for depth in range(1, len(parts)):
            files.setdefault(f"{KIT_DIR}/{'/'.join(parts[:depth])}/__init__.py", "")
        files[f"{KIT_DIR}/{path}"] = source
    return files


def prototype_kit(
    api_source: str,
    incoming_code: str,
    tasks: Sequence[Mapping[str, Any]],
    services: Mapping[str, str],
    modules: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The kit's files (workspace-relative path -> text). ``tasks``: ``Environment.reset()`` of D_harness items;
    ``services``: service name -> base URL (only those the run deployed); ``modules``: the domain's
    standard-library tool code (``Domain.prototype_modules``)."""
    lines: list[str] = []
    for task in list(tasks)[:MAX_TASKS]:
        line = json.dumps(task, ensure_ascii=False, sort_keys=True, default=str)
        if len(line.encode()) <= MAX_TASK_BYTES:
            lines.append(line)
    named = ", ".join(f"`{n}`" for n in sorted(services)) or "none deployed in this run"
    return {
        **_packages({**(modules or {}), "whale/harness/api.py": api_source}),
        f"{KIT_DIR}/incoming.py": incoming_code,
        f"{KIT_DIR}/tasks.jsonl": "".join(line + "\n" for line in lines),
        f"{KIT_DIR}/services.json": json.dumps(dict(sorted(services.items())), indent=1),
        f"{KIT_DIR}/tools.py": _TOOLS,
        f"{KIT_DIR}/README.md": _README.format(services=named),
    }
