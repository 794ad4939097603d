"""Sandbox launcher: isolates itself, then execs the interpreter on the guarded program.

Run by the parent as ``python -I -S _boot.py CONFIG_JSON`` in a fresh session. Stdlib only (it runs
before any site-packages exist for it). Steps, each recorded in a status JSON written to the
``status_fd`` pipe before exec (so the parent learns what isolation was really achieved):

1. new network (+ mount) namespace via ``unshare(2)`` — Python 3.11 has no ``os.unshare``, so ctypes;
   as a non-root user it tries a user namespace instead; if neither works, the guard's socket hook;
2. in the mount namespace: everything private, ``hide`` paths covered by empty read-only tmpfs,
   the scratch directory and ``expose`` paths bound back in place;
3. drop to the sandbox uid/gid (no supplementary groups), set no_new_privs;
4. rlimits, chdir scratch, execve the interpreter with the allow-listed environment.

Doing this after exec (instead of in a ``preexec_fn``) keeps the fork in the parent async-signal safe
even when the parent has threads.
"""

import ctypes
import ctypes.util
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_NO_NEW_PRIVS = 38
SETUP_FAILED_EXIT = 121

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags):
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def _mount(source, target, fstype, flags, data):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _make_mounts(cfg, status):
    """Hide ``hide`` dirs behind tmpfs; bind scratch and ``expose`` paths back at the same place."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    hide = [h for h in cfg["hide"] if os.path.isdir(h) and not os.path.islink(h)]
    keep = [cfg["scratch"]] + [p for p in cfg["expose"] if os.path.exists(p)]
    keep = [p for p in keep if any(_under(p, h) for h in hide)]
    fds = {p: os.open(p, os.O_PATH) for p in keep}
    for h in hide:
        _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for p, fd in fds.items():
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "a").close()
        _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC, None)
        os.close(fd)
    for h in hide:  # read-only once the bind targets exist
        _mount(None, h, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    status["hidden"] = hide


def _isolate_network(cfg, status):
    """New network (and mount) namespace; ``network='audit-hook'`` skips only the network part."""
    want_net = cfg["network"] != "audit-hook"
    errors = []
    if os.geteuid() == 0:
        flags = (CLONE_NEWNET if want_net else 0) | (CLONE_NEWNS if cfg["mount"] else 0)
        if flags:
            try:
                _unshare(flags)
            except OSError as exc:
                errors.append(str(exc))
                flags = CLONE_NEWNET if want_net else 0
                try:
                    if flags:
                        _unshare(flags)
                except OSError as exc2:
                    errors.append(str(exc2))
                    flags = 0
            if flags & CLONE_NEWNS:
                _make_mounts(cfg, status)
                status["mounts"] = True
            if flags & CLONE_NEWNET:
                status["network"] = "netns"
                return
    elif want_net:
        uid, gid = os.getuid(), os.getgid()
        try:
            _unshare(CLONE_NEWUSER | CLONE_NEWNET)
            # map our own ids to themselves so file access is unchanged
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
            status["network"] = "netns-userns"
            return
        except OSError as exc:
            errors.append(str(exc))
    if want_net and cfg["network"] == "netns":
        raise OSError(f"no network namespace could be created ({'; '.join(errors)}) and network='netns'")
    status["network"] = "audit-hook"
    if errors:
        status["network_warning"] = "; ".join(errors)


def _drop_privileges(cfg, status):
    uid = cfg.get("uid")
    if uid is None or os.geteuid() != 0:
        status["uid"] = os.getuid()
        status["uid_dropped"] = False
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    status["uid"] = uid
    status["uid_dropped"] = True


def main():
    cfg = json.loads(sys.argv[1])
    status = {"network": None, "mounts": False, "uid_dropped": False}
    status_fd = cfg["status_fd"]
    try:
        _isolate_network(cfg, status)
        _drop_privileges(cfg, status)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        for name, (soft, hard) in cfg["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        os.chdir(cfg["scratch"])
        if not os.access(cfg["python"], os.X_OK) or not os.access(cfg["guard_path"], os.R_OK):
            raise PermissionError(
                f"the sandbox uid cannot run {cfg['python']} / read {cfg['guard_path']}; "
                "install the interpreter world-readable or enable the mount namespace"
            )
        guard = dict(cfg["guard"])
        guard["net_hook"] = status["network"] == "audit-hook"
        # still the caller's uid: only the (best-effort) write-guard hook keeps writes in scratch
        guard["fs_hook"] = None if status["uid_dropped"] else cfg["scratch"]
        status["guard"] = {"net_hook": guard["net_hook"], "fs_hook": bool(guard["fs_hook"])}
        argv = [cfg["python"], "-I", "-u", cfg["guard_path"], json.dumps(guard)]
        os.write(status_fd, json.dumps(status).encode())
        os.close(status_fd)
        os.execve(cfg["python"], argv, cfg["env"])
    except BaseException as exc:  # report every setup failure to the parent, then exit distinctively
        status["error"] = f"{type(exc).__name__}: {exc}"
        try:
            os.write(status_fd, json.dumps(status).encode())
        except OSError:
            pass
        os._exit(SETUP_FAILED_EXIT)


if __name__ == "__main__":
    main()
