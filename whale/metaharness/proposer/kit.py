"""The proposer's prototyping kit: what the reference's skills ask the proposer to try before it writes a
candidate (call the harness's ``search()`` on a few real questions against the retriever, try its hooks on
trajectories), put into the agent's workspace as plain files.

``proto/`` in the workspace holds the harness API (``whale/harness/api.py``, standard library only, so any
``python3`` imports it with ``proto/`` on ``sys.path``), the domain's standard-library tool code
(``Domain.prototype_modules``: search_qa's ``search_qa/tool.py`` and math_reasoning's ``math_reasoning/tool.py``,
each tool's answer, the very file its environment runs, ``whale/tools/passage_row.py``, how a retriever's row
is read, and ``whale/tools/service_call.py``, how a service's failure reads), the incoming harness (``incoming.py``), the D_harness tasks as the harness sees them
(``tasks.jsonl``: ``Environment.reset()`` of each item — no gold answer, no test item), ``tools.py`` (the domain's tool services over HTTP, standard library only, at the URLs
``services.json`` lists; with a chess run's environment service, ``step`` plays moves on D_harness tasks) and
``README.md``. Only the services the harness-search workload itself reaches
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
``math_reasoning/tool.py``), also when a service fails (the same tool error, ``whale/tools/service_call.py``);
``retrieve`` is the retriever's raw answer and ``run_code`` the interpreter's. ``step(task, actions)`` plays a
harness's environment actions (chess: moves in UCI) on a fresh episode of a D_harness task through the run's
environment service: what the harness's ``observe`` gets for each. The URLs are in services.json; a service the
run has not deployed is missing there."""

import http.client
import json
import os
import urllib.parse

from whale.tools.service_call import CODE_SERVICE_FAILED, ToolServiceError, TransportFailure, post_json

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICES = json.load(open(os.path.join(HERE, "services.json")))


def _url(name, path):
    if name not in SERVICES:
        raise RuntimeError(f"no {name} service in this run (services.json lists {sorted(SERVICES)})")
    return SERVICES[name].rstrip("/") + path


def _http(url, payload=None, timeout=60):
    """(status, body text) of a GET (no payload) or a JSON POST. Behind an HTTP proxy (an agent behind the egress
    proxy: only CONNECT goes out) through a CONNECT tunnel to the service; else straight to it."""
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.parse.urlsplit(os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy") or "")
    try:
        if proxy.hostname:
            conn = http.client.HTTPConnection(proxy.hostname, proxy.port or 80, timeout=timeout)
            conn.set_tunnel(parts.hostname, parts.port or 80)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            if payload is None:
                conn.request("GET", path)
            else:
                conn.request("POST", path, json.dumps(payload).encode(), {"content-type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()
    except (OSError, http.client.HTTPException) as exc:  # refused, timed out, reset while reading
        raise TransportFailure(str(exc) or type(exc).__name__) from exc


def _sender(timeout):
    def send(url, payload):
        return _http(url, payload, timeout)

    return send


def _post(name, path, payload, timeout=60):
    return post_json(_sender(timeout), _url(name, path), payload)


def retrieve(query_list, topk=3, max_doc_tokens=None):
    """The retriever's raw answer: for each query, its top passages {"id", "title", "text", "contents"}."""
    payload = {"queries": list(query_list), "topk": int(topk)}
    if max_doc_tokens is not None:
        payload["max_doc_tokens"] = int(max_doc_tokens)
    return _post("retriever", "/retrieve", payload)["result"]


def _cuts_tokens():
    """Whether the retriever cuts in the policy's tokens (started with --tokenizer), as the environment asks: its
    /healthz answer read whatever its status; no answer or no JSON = no."""
    try:
        about = json.loads(_http(_url("retriever", "/healthz"))[1])
    except (TransportFailure, ValueError):
        return False
    return isinstance(about, dict) and bool(about.get("tokenizer"))


def _passages(query_list, topk, max_doc_tokens):
    from whale.tools.passage_row import passage_fields

    rows = retrieve(query_list, topk, max_doc_tokens)
    return [[passage_fields(d.get("document", d))[1:3] for d in row] for row in rows]


def call(name, arguments):
    """A tool call as a harness's action makes it ({"kind": "tool", "name": ..., "arguments": ...}): the text the
    model reads. A tool error raises ValueError with the message the model would read. ``call("env", {"task":
    ..., "actions": [...]})`` is :func:`step`."""
    if name == "search":
        from search_qa.tool import answer

        return answer(dict(arguments), _passages, _cuts_tokens)
    if name == "code_interpreter":
        from math_reasoning.tool import answer

        return answer(dict(arguments), _run)
    if name == "env":  # the environment's own step answers: {"task": TASK, "actions": [...]}
        return step(arguments.get("task"), arguments.get("actions") or [])
    raise ValueError(f"call: no tool {name!r} in this kit")


def _run(code):
    try:  # the environment's client sends no timeout and waits up to 150 s
        result = _post("sandbox", "/run", {"code": code}, timeout=150)
    except ToolServiceError as exc:
        return "", f"{CODE_SERVICE_FAILED}{exc}"
    return str(result.get("output", "")), result.get("error")


def search(query_list, topk=3, max_doc_tokens=200):
    """``call("search", ...)``: the JSON {"result": "Doc 1(Title: t) text ..."} the model reads."""
    return call("search", {"query_list": list(query_list), "topk": topk, "max_doc_tokens": max_doc_tokens})


def run_code(code, timeout_s=30):
    """The code interpreter's answer for ``code`` (its status, stdout, stderr)."""
    return _post("sandbox", "/run", {"code": code, "timeout_s": timeout_s}, timeout=timeout_s * 4 + 30)


def step(task, actions):
    """A fresh episode of the D_harness task ``task`` (a line of tasks.jsonl, as it is) with ``actions`` (a harness's
    environment actions, e.g. UCI moves) played in turn: for each, what the harness's ``observe`` gets,
    {"kind": "env", "observation": {...}, "done": bool}, up to the one that ends the episode. Only D_harness tasks
    are served; ToolServiceError when the service refuses (another task) or fails."""
    return _post("env", "/step", {"task": task, "actions": list(actions)})["results"]
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
  `max_doc_tokens` as in the episodes), a failing service's tool error included. `tools.step(task, actions)`
  (with an `env` service: chess) plays a harness's environment actions (UCI moves) on a fresh episode of a task of
  `tasks.jsonl` (the line's object, as it is) and returns what its `observe` hook gets for each, as in the episodes.
"""


_OFFLINE_README = """# Prototyping kit (offline)

Read and import these in `run_shell` (`python3` with `proto/` on `sys.path`); there is no network here, so the
run's tools are reached through the `try_harness` tool instead of `tools.py`.

* `whale/harness/api.py` — the harness API; `incoming.py` — the harness this phase started from; import a candidate
  the same way and call its hooks (`start`, `parse`, `observe`, ...) on a task with a state dict of your own.
* `tasks.jsonl` — the D_harness tasks as a harness's `start(task, state)` gets them (no gold answers); their `id`s
  are what `try_harness` takes as `items`.
"""

#: the same for a ``cli`` agent without a network (``network: none``)
CLI_OFFLINE_README = """# Prototyping kit (offline)

Import these with `python3` (`proto/` on `sys.path`). The run's tool services are out of reach from here (you have
no network), so the kit has no `tools.py`.

* `whale/harness/api.py` — the harness API; `incoming.py` — the harness this phase started from; import a candidate
  the same way and call its hooks (`start`, `parse`, `observe`, ...) on a task with a state dict of your own.
* `tasks.jsonl` — the D_harness tasks as a harness's `start(task, state)` gets them (no gold answers).
"""

#: the kit's service clients: no use where the agent has no network (the built-in agents' shell)
_ONLINE_ONLY = (f"{KIT_DIR}/tools.py", f"{KIT_DIR}/services.json")


def kit_services(files: Mapping[str, str]) -> tuple[str, ...]:
    """The service URLs a kit's ``services.json`` lists (none: no such file, or not a JSON object of URLs)."""
    try:
        services = json.loads(files.get(f"{KIT_DIR}/services.json", "{}"))
    except ValueError:
        return ()
    if not isinstance(services, dict):
        return ()
    return tuple(sorted({u for u in services.values() if isinstance(u, str) and u.startswith("http://")}))


def offline_kit(files: Mapping[str, str], readme: str = _OFFLINE_README) -> dict[str, str]:
    """The kit for an agent without network (the built-in agents: their ``run_shell`` has none, their
    ``try_harness`` reaches the tools; a walled ``cli`` agent, with :data:`CLI_OFFLINE_README`): the same files but
    the service clients, and a README saying so."""
    out = {path: text for path, text in files.items() if path not in _ONLINE_ONLY}
    if f"{KIT_DIR}/README.md" in out:
        out[f"{KIT_DIR}/README.md"] = readme
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
