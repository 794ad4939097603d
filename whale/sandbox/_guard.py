"""Inside the sandbox: check no privilege is left, report, install the audit hooks, run the program.

Exec'd by ``_boot.py`` as ``python -I -u /sandbox/guard.py CONFIG_JSON`` (copied into the sandbox's
read-only root, so nothing of the checkout needs to be visible). Stdlib only.

Before any untrusted code runs it reads ``/proc/self/status``: with ``level == "namespaces"`` the
process must hold no capability (effective, permitted, ambient), run with no_new_privs and a non-zero
uid — otherwise it reports a setup error and exits, so a wall that silently failed to drop privileges
is never mistaken for a sandbox. Then it writes the launcher's status to the parent and closes that
descriptor.

The audit hooks (PEP 578) are **defence in depth only** — the walls are the namespaces, the new root
and the uid. They refuse internet sockets (unless ``Isolation(host_network=True)`` was asked for), opens
(any mode, by str, bytes or descriptor path, also ``os.open(..., dir_fd=)``) outside the
allow-listed read roots, and writes or file-system changes outside the scratch directory. C code (ctypes, extension modules, other binaries) is not seen by
them, which is why they are never the only wall; with ``level == "none"`` none is installed.

Worker mode speaks JSON lines: the real stdout is kept as the protocol channel and fd 1 is pointed
at stderr, so whatever the user code prints cannot corrupt it. Requests ``{"id", "fn", "args",
"kwargs"}`` call ``fn`` from the loaded entry file's namespace; replies are ``{"id", "ok": true,
"result"}`` or ``{"id", "ok": false, "error_type", "message", "traceback"}``. The first line is
``{"ready": true, "functions": [...]}`` (or ``{"ready": false, ...}`` when the entry file fails).
"""

import json
import os
import posix
import runpy
import socket
import sys
import threading
import traceback

SETUP_FAILED_EXIT = 121
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: audit event -> [(index of a path the event changes, index of its dir_fd argument or None)]
_CHANGE_EVENTS: dict[str, list[tuple[int, int | None]]] = {
    "os.remove": [(0, 1)],
    "os.rmdir": [(0, 1)],
    "os.mkdir": [(0, 2)],
    "os.rename": [(0, 2), (1, 3)],
    "os.link": [(1, 3)],
    "os.symlink": [(1, 2)],
    "os.truncate": [(0, None)],
    "os.chmod": [(0, 2)],
    "os.chown": [(0, 3)],
    "os.utime": [(0, 3)],
    "os.mkfifo": [(0, 2)],
    "os.mknod": [(0, 3)],
    "shutil.rmtree": [(0, 1)],
    "os.setxattr": [(0, None)],
    "os.removexattr": [(0, None)],
}
#: audit event -> index of a path the event reads
_READ_EVENTS = {"os.listdir": 0, "os.scandir": 0, "os.listxattr": 0, "os.getxattr": 0}
_NET_FAMILIES = {socket.AF_INET, socket.AF_INET6} | ({socket.AF_PACKET} if hasattr(socket, "AF_PACKET") else set())


def _privileges_left():
    """Why this process is not safely unprivileged, or None."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    held = [k for k in ("CapEff", "CapPrm", "CapAmb") if int(fields.get(k, "1"), 16) != 0]
    if held:
        return f"the program still holds capabilities ({', '.join(held)})"
    if fields.get("NoNewPrivs") != "1":
        return "no_new_privs is not set for the program"
    if os.getuid() == 0 or os.geteuid() == 0:
        return "the program still runs as uid 0"
    return None


def _under(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class _Walls:
    """The hooks' allow-lists and checks."""

    def __init__(self, scratch, read_roots, network=False):
        #: the host's network was asked for by name (Isolation(host_network=True)): sockets are allowed
        self.network = network
        self.write_roots = [scratch, "/dev/null"]
        self.read_roots = sorted(set(read_roots) | {scratch})
        #: the directories leading to the read roots ("/", "/root", ...): listing them is harmless
        self.ancestors = {os.path.dirname(r) for r in self.read_roots}
        for path in list(self.ancestors):
            while path != "/":
                path = os.path.dirname(path)
                self.ancestors.add(path)
        self.local = threading.local()

    def resolve(self, path, dir_fd=None):
        """The absolute, symlink-free path an event names, or None (a pipe or socket descriptor)."""
        if isinstance(path, int):
            target = os.readlink(f"/proc/self/fd/{path}")
            return os.path.realpath(target) if target.startswith("/") else None
        text = os.fsdecode(path)
        if not os.path.isabs(text) and dir_fd is not None and dir_fd >= 0:
            base = os.readlink(f"/proc/self/fd/{dir_fd}")
            if not base.startswith("/"):
                raise PermissionError(f"sandbox: {text!r} relative to a descriptor that is no directory")
            text = os.path.join(base, text)
        return os.path.realpath(text)

    def readable(self, path):
        if path in self.ancestors:
            return True
        if _under(path, self.read_roots):
            if path.startswith("/proc/"):
                head = path.split("/")[2]
                return not head.isdigit() or int(head) == os.getpid()
            return True
        return path.startswith("/proc/") and not path.split("/")[2].isdigit()

    def check_open(self, path, flags, dir_fd=None):
        resolved = self.resolve(path, dir_fd)
        if resolved is None:
            return
        if flags & _WRITE_FLAGS:
            if not _under(resolved, [*self.write_roots, f"/proc/{os.getpid()}/fd"]):
                raise PermissionError(f"sandbox: writing outside the scratch directory is not allowed: {resolved}")
        elif not self.readable(resolved):
            raise PermissionError(f"sandbox: reading {resolved} is not allowed")

    def hook(self, event, args):
        if event == "open":
            path, _mode, flags = args
            if path is None:
                return
            checked = getattr(self.local, "checked", None)
            if checked is not None and checked is path:
                self.local.checked = None  # os.open with dir_fd: checked by the wrapper
                return
            self.check_open(path, flags or 0)
        elif event in _CHANGE_EVENTS:
            for index, fd_index in _CHANGE_EVENTS[event]:
                path = args[index] if len(args) > index else None
                if path is None:
                    continue
                dir_fd = args[fd_index] if fd_index is not None and len(args) > fd_index else None
                resolved = self.resolve(path, dir_fd if isinstance(dir_fd, int) else None)
                if resolved is not None and not _under(resolved, self.write_roots):
                    raise PermissionError(f"sandbox: {event} outside the scratch directory is not allowed: {resolved}")
        elif event in _READ_EVENTS:
            path = args[_READ_EVENTS[event]] if args else None
            if path is not None:
                resolved = self.resolve(path)
                if resolved is not None and not self.readable(resolved):
                    raise PermissionError(f"sandbox: reading {resolved} is not allowed")
        elif event == "socket.__new__" and not self.network and len(args) > 1 and args[1] in _NET_FAMILIES:
            raise PermissionError("sandbox: network access is disabled")

    def wrap_os_open(self):
        """``os.open(path, flags, dir_fd=fd)``: the audit event loses ``dir_fd``, so check here."""
        original = os.open

        def sandboxed_open(path, flags, mode=0o777, *, dir_fd=None):
            if dir_fd is None or isinstance(path, int):
                return original(path, flags, mode, dir_fd=dir_fd)
            self.check_open(path, flags, dir_fd)
            self.local.checked = path  # the audit event of this very call is already checked
            try:
                return original(path, flags, mode, dir_fd=dir_fd)
            finally:
                self.local.checked = None

        sandboxed_open.__doc__ = original.__doc__
        os.open = posix.open = sandboxed_open


def install_hooks(scratch, read_roots, network=False):
    walls = _Walls(os.path.realpath(scratch), [os.path.realpath(r) for r in read_roots], network)
    walls.wrap_os_open()
    sys.addaudithook(walls.hook)
    return walls


def _serve(namespace, proto):
    functions = sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("_"))
    proto.write(json.dumps({"ready": True, "functions": functions}) + "\n")
    proto.flush()
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            rid = req.get("id")
        except ValueError as exc:
            proto.write(
                json.dumps({"id": None, "ok": False, "error_type": "ProtocolError", "message": str(exc)}) + "\n"
            )
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


def _report(cfg):
    """Check what the launcher promised, then tell the parent (the status descriptor is closed after)."""
    status, status_fd = cfg.pop("status"), cfg.pop("status_fd")
    problem = _privileges_left() if cfg["sandboxed"] else None
    if problem:
        status["error"] = (
            f"{problem}; the only alternative is no isolation at all, which must be asked for "
            "by name: Isolation(level='none') / the spec's `isolation: none`"
        )
    else:
        status["capabilities"] = "none" if cfg["sandboxed"] else "the caller's"
        status["audit_hooks"] = bool(cfg["sandboxed"])
    os.write(status_fd, json.dumps(status).encode())
    os.close(status_fd)
    if problem:
        os._exit(SETUP_FAILED_EXIT)


def main():
    cfg = json.loads(sys.argv[1])
    _report(cfg)
    target = cfg["target"]
    sys.argv = [target, *cfg.get("args", [])]
    sys.path[:0] = [os.path.dirname(os.path.abspath(target)), *cfg.get("sys_path", [])]
    if cfg["sandboxed"]:
        install_hooks(cfg["scratch"], cfg["read_roots"], cfg.get("network", False))
    if cfg["mode"] == "run":
        runpy.run_path(target, run_name="__main__")
        return
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        namespace = runpy.run_path(target, run_name="__sandbox_worker__")
    except BaseException as exc:
        proto.write(
            json.dumps(
                {
                    "ready": False,
                    "error_type": type(exc).__name__,
                    "message": str(exc)[:4000],
                    "traceback": traceback.format_exc()[-8000:],
                }
            )
            + "\n"
        )
        proto.flush()
        raise
    _serve(namespace, proto)


if __name__ == "__main__":
    main()
