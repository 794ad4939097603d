"""Inside the sandbox: install fallback audit hooks, then run a program or serve worker calls.

Exec'd by ``_boot.py`` as ``python -I -u _guard.py CONFIG_JSON``. Stdlib only.

Audit hooks (PEP 578) are a *fallback*, not a security boundary: they only matter where the kernel
isolation failed (no network namespace → ``net_hook`` refuses internet sockets; no uid drop →
``fs_hook`` refuses writes outside scratch). While either hook is active, ways around hooks
(ctypes, exec of other binaries) are refused too.

Worker mode speaks JSON lines: the real stdout is kept as the protocol channel and fd 1 is pointed
at stderr, so whatever the user code prints cannot corrupt it. Requests ``{"id", "fn", "args",
"kwargs"}`` call ``fn`` from the loaded entry file's namespace; replies are ``{"id", "ok": true,
"result"}`` or ``{"id", "ok": false, "error_type", "message", "traceback"}``. The first line is
``{"ready": true, "functions": [...]}`` (or ``{"ready": false, ...}`` when the entry file fails).
"""

import json
import os
import runpy
import socket
import sys
import traceback

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {
    "os.remove": 1, "os.rename": 2, "os.mkdir": 1, "os.rmdir": 1, "os.chmod": 1, "os.chown": 1,
    "os.link": 2, "os.symlink": 2, "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1,
    "shutil.copyfile": 2, "shutil.move": 2, "os.mkfifo": 1, "os.mknod": 1,
}  # event -> how many leading args are paths (the last of them is the one written)
_ESCAPES = ("ctypes.dlopen", "ctypes.dlsym", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen")
_NET_FAMILIES = {socket.AF_INET, socket.AF_INET6} | ({socket.AF_PACKET} if hasattr(socket, "AF_PACKET") else set())


def _install_hooks(net_hook, fs_root):
    allowed = [os.path.realpath(fs_root)] if fs_root else []

    def inside(path):
        if isinstance(path, int):
            return True  # an already-open descriptor
        p = os.path.realpath(os.fsdecode(path))
        return p == "/dev/null" or any(p == a or p.startswith(a + "/") for a in allowed)

    def hook(event, args):
        if net_hook and event == "socket.__new__" and len(args) > 1 and args[1] in _NET_FAMILIES:
            raise PermissionError("sandbox: network access is disabled")
        if event.startswith(_ESCAPES):
            raise PermissionError(f"sandbox: {event} is not allowed (kernel isolation is unavailable here)")
        if fs_root is None:
            return
        if event == "open":
            path, _mode, flags = args
            if path is not None and flags and flags & _WRITE_FLAGS and not inside(path):
                raise PermissionError(f"sandbox: writing outside the scratch directory is not allowed: {path}")
        elif event in _PATH_EVENTS:
            for path in args[: _PATH_EVENTS[event]]:
                if path is not None and not inside(path):
                    raise PermissionError(f"sandbox: {event} outside the scratch directory is not allowed: {path}")

    if net_hook or fs_root:
        sys.addaudithook(hook)


def _serve(namespace, proto):
    functions = sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("_"))
    proto.write(json.dumps({"ready": True, "functions": functions}) + "\n")
    proto.flush()
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            rid = req.get("id")
        except ValueError as exc:
            proto.write(json.dumps({"id": None, "ok": False, "error_type": "ProtocolError", "message": str(exc)}) + "\n")
            proto.flush()
            continue
        try:
            fn = namespace.get(req["fn"])
            if fn is None or not callable(fn):
                raise NameError(f"the worker entry defines no function {req['fn']!r}")
            result = fn(*req.get("args", ()), **req.get("kwargs", {}))
            reply = json.dumps({"id": rid, "ok": True, "result": result})
        except BaseException as exc:  # a failing call is an answer, not the worker's death
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            reply = json.dumps(
                {
                    "id": rid,
                    "ok": False,
                    "error_type": type(exc).__name__,
                    "message": str(exc)[:4000],
                    "traceback": traceback.format_exc()[-8000:],
                }
            )
        proto.write(reply + "\n")
        proto.flush()


def main():
    cfg = json.loads(sys.argv[1])
    target = cfg["target"]
    sys.argv = [target, *cfg.get("args", [])]
    sys.path[:0] = [os.path.dirname(os.path.abspath(target)), *cfg.get("sys_path", [])]
    _install_hooks(cfg.get("net_hook"), cfg.get("fs_hook"))
    if cfg["mode"] == "run":
        runpy.run_path(target, run_name="__main__")
        return
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        namespace = runpy.run_path(target, run_name="__sandbox_worker__")
    except BaseException as exc:
        proto.write(json.dumps({"ready": False, "error_type": type(exc).__name__, "message": str(exc)[:4000],
                                "traceback": traceback.format_exc()[-8000:]}) + "\n")
        proto.flush()
        raise
    _serve(namespace, proto)


if __name__ == "__main__":
    main()
