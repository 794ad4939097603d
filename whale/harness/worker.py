"""The code inside the sandboxed harness process: load one harness file, answer hook calls. Standard library only.

The process is started by ``whale.harness.launch`` through ``whale.sandbox`` (whose guard runs an entry
file that calls :func:`serve_entry` and serves the returned functions as JSON lines). It sees only what
it is given: a staged, read-only package directory holding this file, ``api.py`` and two empty
``__init__.py`` files, the standard library, and the harness file in its scratch directory. Before the
harness runs, :func:`confine_imports` drops every other import path and finder (what ``python -S``
would leave out), and an audit hook (:func:`install_audit_hook`) refuses, from then on: sockets,
subprocesses, writes of any kind, reads other than the harness file and Python sources of the standard
library and of this package, directory listings elsewhere, opening descriptors by number, frame
introspection, and imports outside the domain's allow list. The hook is defence in depth; the wall is
the process sandbox (namespaces, a fresh uid, rlimits), and the static gate (``whale.harness.validate``)
comes before both.

Protocol (served by the guard): request ``{"id", "fn": "describe"|"start"|"parse"|"observe", "kwargs"}``;
each function returns a plain JSON value, never raises: ``{"decision": {...}, "state": {...}}`` for a
hook, the declared constants for ``describe``, or ``{"error": "one line"}`` when the harness failed
(to load, or in this call). Returning errors instead of raising keeps tracebacks (and the frame
objects they need) out of the guard's reply path.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from whale.harness import api

#: audit events refused outright once the harness code may run (prefix match)
_BLOCKED_EVENT_PREFIXES = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chdir",
    "os.chmod",
    "os.chown",
    "os.chflags",
    "os.lchflags",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.utime",
    "os.mkfifo",
    "os.mknod",
    "os.putenv",
    "os.unsetenv",
    "os.setxattr",
    "os.getxattr",
    "os.listxattr",
    "os.removexattr",
    "os.startfile",
    "os.add_dll_directory",
    "shutil.",
    "ctypes.",
    "mmap.",
    "fcntl.",
    "resource.",
    "signal.",
    "glob.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "poplib.",
    "imaplib.",
    "nntplib.",
    "telnetlib.",
    "webbrowser.",
    "sqlite3.",
    "sys._getframe",
    "sys._current_frames",
    "sys.settrace",
    "sys.setprofile",
    "sys.addaudithook",
    "sys.monitoring",
    "gc.",
    "code.__new__",
    "function.__new__",
    "marshal.",
    "pickle.",
    "builtins.input",
    "cpython.",
    "_posixsubprocess.",
    "pty.",
)
# Threads are allowed: Python raises no audit event when one starts (so listing ``_thread.`` here blocked
# nothing), and a thread crosses no wall: it runs in this process, under this hook, in the sandbox's
# namespaces and filter, counted by RLIMIT_NPROC (docs/security.md, "The sandbox").
#: ``os.open``/``open`` flags that mean writing (the ``open`` event's third argument)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: file kinds the import system reads from the allowed directories
_SOURCE_SUFFIXES = (".py", ".pyc")
#: never readable, even under an allowed directory (a system Python keeps installed packages, domain
#: code among them, under its standard library directory)
_EXCLUDED_PARTS = ("site-packages", "dist-packages")


class _Blocked(PermissionError):
    pass


def confine_imports(package_dir: str, stdlib_dirs: Iterable[str], scratch: str) -> None:
    """Import only from the standard library and the staged package, as ``python -I -S`` would.

    Drops every other ``sys.path`` entry (site-packages, the scratch directory), every meta-path finder
    that is not the interpreter's own (an editable install's finder maps the whole checkout), and the
    modules ``site`` loaded from outside those directories (not ``__main__`` nor the entry file in
    ``scratch``, which are running)."""
    roots = [os.path.realpath(p) for p in (package_dir, *stdlib_dirs)]
    sys.path[:] = [package_dir, *(p for p in sys.path if os.path.realpath(p) in roots[1:])]
    sys.meta_path[:] = [f for f in sys.meta_path if _module_of(f).startswith("_frozen_importlib")]
    sys.path_importer_cache.clear()
    running = [os.path.realpath(scratch)]
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(path, str):
            continue
        real = os.path.realpath(path)
        if not _under_any(real, roots) and not _under_any(real, running):
            del sys.modules[name]


def _module_of(finder: object) -> str:
    kind = finder if isinstance(finder, type) else type(finder)
    return str(getattr(kind, "__module__", ""))


def _under_any(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


class _Trust:
    """Whether the worker's own code (not the harness) is running: only then may frames be read
    (walking a traceback for the harness's line number)."""

    def __init__(self) -> None:
        self.depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1


def install_audit_hook(allowed: frozenset[str], harness_file: str, read_roots: Iterable[str], trust: _Trust) -> None:
    """Refuse dangerous operations from here on (an audit hook cannot be removed once added).

    ``read_roots``: directories whose Python sources (and listings) may be read, besides ``harness_file``."""
    preloaded = frozenset(sys.modules)
    roots = tuple(os.path.realpath(r) for r in read_roots)
    harness_real = os.path.realpath(harness_file)

    def inside(real: str) -> bool:
        return _under_any(real, roots) and not any(part in _EXCLUDED_PARTS for part in real.split(os.sep))

    def readable(path: str) -> bool:
        real = os.path.realpath(path)
        return real == harness_real or (inside(real) and real.endswith(_SOURCE_SUFFIXES))

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(_BLOCKED_EVENT_PREFIXES):
            raise _Blocked(f"harness sandbox: {event} is not allowed")
        if event == "import":
            name = str(args[0])
            if name not in preloaded and name.split(".")[0] not in allowed:
                raise _Blocked(f"harness sandbox: import of {name!r} is not allowed")
        elif event == "open":
            path, flags = args[0], args[2] if len(args) > 2 else 0
            if isinstance(path, int):
                raise _Blocked(f"harness sandbox: opening file descriptor {path} is not allowed")
            if path is None:
                raise _Blocked("harness sandbox: opening a file without a path is not allowed")
            text = os.fsdecode(path)
            if (isinstance(flags, int) and flags & _WRITE_FLAGS) or (
                isinstance(args[1], str) and set(args[1]) & set("wax+")
            ):
                raise _Blocked(f"harness sandbox: opening {text!r} for writing is not allowed")
            # relative paths may be relative to a dir_fd the event does not show: refuse them
            if not os.path.isabs(text) or not readable(text):
                raise _Blocked(f"harness sandbox: reading {text!r} is not allowed")
        elif event in ("os.listdir", "os.scandir"):
            path = args[0] if args else None
            if not isinstance(path, str | bytes) or not inside(os.path.realpath(os.fsdecode(path))):
                raise _Blocked(f"harness sandbox: listing {path!r} is not allowed")
        elif event == "object.__getattr__" and not trust.depth:
            raise _Blocked(f"harness sandbox: reading {args[1]!r} (frame introspection) is not allowed")

    sys.addaudithook(hook)


def _preload(allowed: frozenset[str]) -> None:
    """Import the allowed modules (and what they import lazily) before the audit hook goes up."""
    for name in sorted(allowed):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    if "random" in allowed and "random" in sys.modules:
        sys.modules["random"].Random(0).random()  # its lazy imports (hashlib)
    import encodings.idna  # noqa: F401 - str.encode('idna') must not import later
    import linecache  # noqa: F401 - tracebacks need it


def load_harness(path: str, allowed: frozenset[str], read_roots: Iterable[str], trust: _Trust) -> api.BaseHarness:
    """Execute the harness file as module ``harness`` (audit hook up first) and instantiate ``Harness``."""
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    module = types.ModuleType("harness")
    module.__file__ = path
    sys.modules["harness"] = module
    _preload(allowed)
    install_audit_hook(allowed, path, read_roots, trust)
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the sandbox's whole job
    cls = module.__dict__.get(api.REQUIRED_CLASS)
    if not isinstance(cls, type) or not issubclass(cls, api.BaseHarness):
        raise TypeError(f"the file must define class {api.REQUIRED_CLASS}(BaseHarness)")
    harness = cls()
    for name, types_ in api.CONSTANTS.items():
        value = getattr(harness, name)
        if not isinstance(value, types_) or (isinstance(value, bool) and int in types_):
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


def _plain(value: Any) -> Any:
    """A JSON round trip: plain dicts/lists/strings only leave the worker (a dict subclass's methods
    are harness code and must not run in the guard's encoder)."""
    return json.loads(json.dumps(value))


def _error(exc: BaseException, path: str, trust: _Trust, prefix: str = "") -> dict[str, str]:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001 - a harness exception whose __str__ raises
        text = type(exc).__name__
    return {"error": (prefix + text.replace("\n", " "))[:500] + _where(exc, path, trust)}


def _where(exc: BaseException, path: str, trust: _Trust) -> str:
    """`` (harness line N)``: the deepest traceback entry in the harness file (frames read under trust;
    no harness code runs while walking them)."""
    line = None
    with trust:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == path:
                line = tb.tb_lineno
            tb = tb.tb_next
    return f" (harness line {line})" if line is not None else ""


def harness_functions(path: str, allowed: Iterable[str], read_roots: Iterable[str]) -> dict[str, Callable[..., Any]]:
    """Load the harness; return the functions the worker serves: ``describe`` and one per hook.

    A hook function takes the hook's keyword arguments plus ``state`` and returns ``{"decision": ...,
    "state": ...}`` or ``{"error": ...}``. When the harness does not load, every function returns that
    load error (the runtime asks ``describe`` first)."""
    path = os.path.abspath(path)
    trust = _Trust()
    try:
        harness = load_harness(path, frozenset(allowed), read_roots, trust)
    except BaseException as exc:  # noqa: BLE001 - reported to the runtime as the load error
        failed = _error(exc, path, trust, "the harness failed to load: ")
        return {name: (lambda failed=failed, **_: failed) for name in (*api.HOOKS, "describe")}

    def make(hook: str) -> Callable[..., Any]:
        def call(state: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
            state = state if isinstance(state, dict) else {}
            try:
                return _plain({"decision": getattr(harness, hook)(**kwargs, state=state), "state": state})
            except BaseException as exc:  # noqa: BLE001 - one hook's failure is an answer, not the process's death
                return _error(exc, path, trust)

        call.__name__ = hook
        return call

    def describe_call() -> dict[str, Any]:
        try:
            return _plain(describe(harness))
        except BaseException as exc:  # noqa: BLE001
            return _error(exc, path, trust)

    functions: dict[str, Callable[..., Any]] = {hook: make(hook) for hook in api.HOOKS}
    functions["describe"] = describe_call
    return functions


def serve_entry(config: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """What the sandbox's entry file calls: confine imports, then load the harness.

    ``config``: ``harness`` (path), ``allowed`` (import allow list), ``package_dir`` (the staged
    package), ``stdlib_dirs`` (the interpreter's standard library directories)."""
    package_dir, stdlib_dirs = str(config["package_dir"]), [str(p) for p in config["stdlib_dirs"]]
    harness = os.path.abspath(str(config["harness"]))
    confine_imports(package_dir, stdlib_dirs, os.path.dirname(harness))
    return harness_functions(harness, config["allowed"], [package_dir, *stdlib_dirs])
