"""The proposer's prototyping kit: what the reference's skills ask the proposer to try before it writes a
candidate (call the harness's ``search()`` on a few real questions against the retriever, try its hooks on
trajectories), put into the agent's workspace as plain files.

``proto/`` in the workspace holds the harness API (``whale/harness/api.py``, standard library only, so any
``python3`` imports it with ``proto/`` on ``sys.path``), the incoming harness (``incoming.py``), the D_harness
tasks as the harness sees them (``tasks.jsonl``: ``Environment.reset()`` of each item — no gold answer, no
test item), ``tools.py`` (the domain's tool services over HTTP, standard library only, at the URLs
``services.json`` lists) and ``README.md``. Only the services the harness-search workload itself reaches
are listed (their URL variables set in its environment): the agent reaches them with the network it has
for its model's API; nothing else is added (no credential, no store, no data root).

:func:`prototype_kit` is pure: the caller reads the API's source and the tasks and names the services.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

KIT_DIR = "proto"
#: tasks put into the kit at most (D_harness is 256 in every domain)
MAX_TASKS = 256
#: bytes of one task's JSON line at most (a bigger one is left out, not cut)
MAX_TASK_BYTES = 64_000

_TOOLS = '''"""The run's tool services, standard library only: ``search`` (search_qa's retriever) and ``run_code``
(math_reasoning's interpreter), at the URLs of services.json. A service the run has not deployed is missing there."""

import json
import os
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICES = json.load(open(os.path.join(HERE, "services.json")))


def _post(name, path, payload, timeout=60):
    if name not in SERVICES:
        raise RuntimeError(f"no {name} service in this run (services.json lists {sorted(SERVICES)})")
    req = urllib.request.Request(
        SERVICES[name].rstrip("/") + path, json.dumps(payload).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def retrieve(query_list, topk=3, max_doc_tokens=None):
    """The retriever's raw answer: for each query, its top passages {"id", "title", "text", "contents"}."""
    payload = {"queries": list(query_list), "topk": int(topk)}
    if max_doc_tokens is not None:
        payload["max_doc_tokens"] = int(max_doc_tokens)
    return _post("retriever", "/retrieve", payload)["result"]


def search(query_list, topk=3):
    """The passages as the search tool renders them for one query: ``Doc i(Title: t) text``, one per line."""
    rows = retrieve(query_list, topk)
    return ["\\n".join(f"Doc {i}(Title: {d['title']}) {d['text']}" for i, d in enumerate(row, 1)) for row in rows]


def run_code(code, timeout_s=30):
    """The code interpreter's answer for ``code`` (its status, stdout, stderr)."""
    return _post("sandbox", "/run", {"code": code, "timeout_s": timeout_s}, timeout=timeout_s * 4 + 30)
'''

_README = """# Prototyping kit

Try ideas here before you write a candidate; the outer loop still scores every candidate itself.

    cd proto && python3 -c "import tools, json; print(tools.search(['QUESTION'])[0])"

* `whale/harness/api.py` — the harness API (`from whale.harness.api import BaseHarness, Decision, ...` with
  `proto/` on `sys.path`); `incoming.py` — the harness this phase started from; import a candidate the same
  way and call its hooks (`start`, `parse`, `observe`, ...) on a task with a state dict of your own.
* `tasks.jsonl` — the D_harness tasks as a harness's `start(task, state)` gets them (no gold answers).
* `tools.py` — the run's tool services: {services}.
"""


def _api_package(api_source: str) -> dict[str, str]:
    return {
        f"{KIT_DIR}/whale/__init__.py": "",
        f"{KIT_DIR}/whale/harness/__init__.py": "",
        f"{KIT_DIR}/whale/harness/api.py": api_source,
    }


def prototype_kit(
    api_source: str, incoming_code: str, tasks: Sequence[Mapping[str, Any]], services: Mapping[str, str]
) -> dict[str, str]:
    """The kit's files (workspace-relative path -> text). ``tasks``: ``Environment.reset()`` of D_harness items;
    ``services``: service name -> base URL (only those the run deployed)."""
    lines: list[str] = []
    for task in list(tasks)[:MAX_TASKS]:
        line = json.dumps(task, ensure_ascii=False, sort_keys=True, default=str)
        if len(line.encode()) <= MAX_TASK_BYTES:
            lines.append(line)
    named = ", ".join(f"`{n}`" for n in sorted(services)) or "none deployed in this run"
    return {
        **_api_package(api_source),
        f"{KIT_DIR}/incoming.py": incoming_code,
        f"{KIT_DIR}/tasks.jsonl": "".join(line + "\n" for line in lines),
        f"{KIT_DIR}/services.json": json.dumps(dict(sorted(services.items())), indent=1),
        f"{KIT_DIR}/tools.py": _TOOLS,
        f"{KIT_DIR}/README.md": _README.format(services=named),
    }
