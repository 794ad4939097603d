"""The code inside the sandboxed harness process: load one harness file, answer hook calls.

The process is started by ``whale.harness.sandbox``: normally through ``whale.sandbox`` (its guard
runs an entry file that calls :func:`harness_functions` and serves the returned functions), or, where
that primitive is unavailable, as ``python -I -m whale.harness.worker FILE`` (:func:`main`), which
speaks the same protocol. Protocol (JSON lines; stdin = requests, the original stdout = answers;
whatever the harness prints goes to stderr):

* first line out: ``{"ready": true, "functions": [...]}`` or ``{"ready": false, "message": ...}``;
* request ``{"id": int, "fn": "describe"|"start"|"parse"|"observe", "args": [...], "kwargs": {...}}``;
* answer ``{"id": int, "ok": true, "result": ...}`` or ``{"id": int, "ok": false, "error_type",
  "message", "traceback"}``. A hook's result is ``{"decision": {...}, "state": {...}}``.

Requests are answered one at a time in arrival order; concurrency lives in the runtime. Before the
harness code runs, an audit hook blocks sockets, subprocesses, file writes, reads outside Python
sources and imports outside the allow list (defence in depth behind the process sandbox and the
static validator).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
import types
from typing import Any

from whale.harness import api

_BLOCKED_EVENT_PREFIXES = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.kill",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.putenv",
    "os.unsetenv",
    "shutil.",
    "ctypes.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "sys._getframe",
    "sys.settrace",
    "sys.setprofile",
    "code.__new__",
    "marshal.",
    "pickle.",
    "webbrowser.",
)


class _Blocked(PermissionError):
    pass


def _install_audit_hook(allowed: frozenset[str], harness_file: str) -> None:
    """Block dangerous operations from here on (audit hooks cannot be removed once added)."""
    preloaded = frozenset(sys.modules)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(_BLOCKED_EVENT_PREFIXES):
            raise _Blocked(f"harness sandbox: {event} is not allowed")
        if event == "import":
            name = str(args[0])
            if name not in preloaded and name.split(".")[0] not in allowed:
                raise _Blocked(f"harness sandbox: import of {name!r} is not allowed")
        elif event == "open":
            path, mode = args[0], args[1]
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            if isinstance(mode, int):  # os.open flags
                writing = bool(mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing:
                raise _Blocked(f"harness sandbox: opening {path!r} for writing is not allowed")
            if isinstance(path, str) and not (path.endswith(".py") or path == harness_file):
                raise _Blocked(f"harness sandbox: reading {path!r} is not allowed")

    sys.addaudithook(hook)


def _preload(allowed: frozenset[str]) -> None:
    """Import the allowed modules (and what they import lazily) before the audit hook goes up."""
    for name in sorted(allowed):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    for name in ("random", "statistics"):  # their lazy imports (hashlib, fractions, decimal)
        if name in allowed:
            mod = sys.modules.get(name)
            if name == "random" and mod is not None:
                mod.Random(0).random()
    import linecache  # noqa: F401 - tracebacks need it

    import encodings.idna  # noqa: F401 - str.encode('idna') must not import later


def load_harness(path: str, allowed: frozenset[str]) -> api.BaseHarness:
    """Execute the harness file as module ``harness`` and instantiate its ``Harness`` class."""
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    module = types.ModuleType("harness")
    module.__file__ = path
    sys.modules["harness"] = module
    _preload(allowed)
    _install_audit_hook(allowed, path)
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the sandbox's whole job
    cls = getattr(module, api.REQUIRED_CLASS, None)
    if not isinstance(cls, type) or not issubclass(cls, api.BaseHarness):
        raise TypeError(f"the file must define class {api.REQUIRED_CLASS}(BaseHarness)")
    harness = cls()
    for name, types_ in api.CONSTANTS.items():
        value = getattr(harness, name)
        if not isinstance(value, types_) or isinstance(value, bool) and int in types_:
            want = " or ".join(t.__name__ for t in types_)
            raise TypeError(f"{name} must be {want}, got {type(value).__name__}")
    if harness.MAX_TURNS < 1:
        raise ValueError(f"MAX_TURNS must be >= 1, got {harness.MAX_TURNS}")
    if harness.TOOLS is not None:
        json.dumps(harness.TOOLS)
        if not all(isinstance(t, dict) for t in harness.TOOLS):
            raise TypeError("TOOLS must be a list of OpenAI function schemas (dicts)")
    return harness


def describe(harness: api.BaseHarness) -> dict[str, Any]:
    constants = {name: getattr(harness, name) for name in api.CONSTANTS}
    return {"constants": constants, "max_turns": harness.MAX_TURNS, "tools": harness.TOOLS}


class HookError(RuntimeError):
    """A hook raised or returned something unserialisable; the message is one line with the harness line."""


def harness_functions(path: str, allowed: list[str] | frozenset[str], max_bytes: int = 8 << 20) -> dict[str, Any]:
    """Load the harness and return the functions the worker serves: ``describe`` and one per hook.

    Each hook function takes the hook's keyword arguments plus ``state`` and returns
    ``{"decision": ..., "state": ...}`` (JSON-checked, at most ``max_bytes``)."""
    path = os.path.abspath(path)
    try:
        harness = load_harness(path, frozenset(allowed))
    except Exception as exc:
        raise HookError(f"the harness failed to load: {_one_line(exc, path)}") from None

    def make(hook: str) -> Any:
        def call(state: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
            state = state if isinstance(state, dict) else {}
            # the answer's size is bounded by the runtime's pipe reader (max_bytes there), not re-encoded here
            try:
                decision = getattr(harness, hook)(**kwargs, state=state)
            except Exception as exc:
                raise HookError(_one_line(exc, path)) from None
            return {"decision": decision, "state": state}

        call.__name__ = hook
        return call

    functions: dict[str, Any] = {hook: make(hook) for hook in api.HOOKS}
    functions["describe"] = lambda: describe(harness)
    return functions


def _where(exc: BaseException, path: str) -> str:
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    return f" (harness line {lines[-1]})" if lines else ""


def _one_line(exc: BaseException, path: str) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:500] + _where(exc, path)



def serve(functions: dict[str, Any], inp: Any, out: Any) -> None:
    """The fallback server loop (same wire as ``whale.sandbox``'s guard)."""
    for line in inp:
        if not line.strip():
            continue
        rid = None
        try:
            request = json.loads(line)
            rid = request.get("id")
            fn = functions.get(request.get("fn"))
            if fn is None:
                raise NameError(f"no function {request.get('fn')!r}")
            answer = json.dumps({"id": rid, "ok": True, "result": fn(*request.get("args", ()), **request.get("kwargs", {}))})
        except Exception as exc:  # noqa: BLE001 - reported to the runtime, the process lives on
            answer = json.dumps({"id": rid, "ok": False, "error_type": type(exc).__name__, "message": str(exc)[:4000]})
        out.write(answer + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="whale.harness.worker")
    parser.add_argument("path")
    parser.add_argument("--allow", default="")
    parser.add_argument("--max-bytes", type=int, default=8 << 20)
    args = parser.parse_args(argv)
    # the protocol owns the real stdout; anything the harness prints lands on stderr
    proto_out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    try:
        functions = harness_functions(args.path, list(filter(None, args.allow.split(","))), args.max_bytes)
    except Exception as exc:  # noqa: BLE001 - one line to the runtime, then exit
        proto_out.write(json.dumps({"ready": False, "error_type": type(exc).__name__, "message": str(exc)}) + "\n")
        proto_out.flush()
        return 2
    proto_out.write(json.dumps({"ready": True, "functions": sorted(functions)}) + "\n")
    proto_out.flush()
    serve(functions, sys.stdin, proto_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
