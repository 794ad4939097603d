"""Sandbox launcher: builds the walls, then execs the interpreter on the guarded program.

Run by the parent as ``python -I -S _boot.py CFG_FD STATUS_FD LIFE_FD RESULT_FD`` in a fresh session;
the configuration (JSON) arrives on ``CFG_FD``, never on the command line. Stdlib only. Three
processes, each with one job:

* **boot** (this process, in the host's PID namespace): unshares new mount, PID, network (unless the
  caller asked for the host's by name), IPC and UTS namespaces (as a non-root caller inside a new user namespace that maps the caller to root), forks
  the init, and then only supervises: when the parent closes (or loses, by dying) the ``LIFE_FD``
  pipe it SIGKILLs the init, whose death makes the kernel kill every process of the namespace; when
  the init reports the program's end it exits the way the program did (same code or signal).
* **init** (PID 1 of the new PID namespace, non-dumpable, SIGKILLed if the boot dies): builds the
  new root — a tmpfs holding only the system runtime, the interpreter's prefix, the allow-listed
  read-only paths and packages, a minimal /dev and /etc, a fresh /proc and a size-bounded scratch
  tmpfs — pivots into it and detaches the host's root; forks the program; reaps; when the program
  ends, kills everything else in the namespace, hands back the requested scratch files, reports.
* **program**: own session; as root's child a fresh unprivileged uid, as a non-root caller's child a
  second user namespace with an unprivileged uid (so it holds no capability over its mounts);
  bounding set emptied, no_new_privs, rlimits; execs ``python -I -u /sandbox/guard.py``.

Every failure before the exec is written to ``STATUS_FD`` as ``{"error": ...}`` (the parent raises
``SandboxSetupError``); the guard writes the success status once it checked it holds no capability.
With ``level == "none"`` the same processes run without namespaces, mounts or uid change.
"""

import base64
import ctypes
import ctypes.util
import fcntl
import json
import os
import platform
import resource
import select
import signal
import socket
import stat
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
SETUP_FAILED_EXIT = 121
#: syscall numbers glibc has no wrapper for
_SYSCALLS = {
    "x86_64": {"pivot_root": 155, "mount_setattr": 442},
    "aarch64": {"pivot_root": 41, "mount_setattr": 442},
}
#: where the new root is assembled (a tmpfs is mounted over it, in our own mount namespace only)
_STAGING_DIRS = ("/tmp", "/mnt", "/media", "/srv")
#: bringing up the loopback interface of the sandbox's network namespace (an egress relay listens on it)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
#: the egress relay: connections it carries at once, seconds it waits to listen
RELAY_CONNECTIONS = 128
RELAY_START_S = 10.0
#: files the sandbox's /dev holds (bind mounts of the host's nodes)
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
#: parts of the fresh /proc made read-only on top of the kernel's own permissions
_PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus")
_NO_FALLBACK = (
    "the only alternative is no isolation at all, which must be asked for by name: "
    "Isolation(level='none') / the spec's `isolation: none`, for trusted local use only"
)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


# --- the program's system-call filter (seccomp, through the system's libseccomp) ---
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
SCMP_CMP_GT = 6
SCMP_CMP_MASKED_EQ = 7
EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
#: socket families a sandboxed program may open: local and IP (there is no interface in its network
#: namespace); netlink too where it shares the host's network (name resolution asks the kernel for its
#: addresses). AF_VSOCK (40), packet, Bluetooth, AF_ALG, ... are refused with EAFNOSUPPORT
_SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)
#: calls no sandboxed program needs, refused with EPERM: new mounts and namespaces (a tmpfs in a nested
#: user namespace held memory outside every limit), anonymous memory files, the kernel keyrings (a
#: keyring shared with the caller carried notes between sandboxes), and kernel interfaces that widen the
#: attack surface (io_uring also opens sockets of any family)
_DENIED_CALLS = (
    "mount", "umount2", "pivot_root", "unshare", "setns", "open_tree", "move_mount", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "memfd_create", "memfd_secret", "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "quotactl",
)  # fmt: skip
#: clone flags that make a namespace: a clone with any of them is refused (clone3, whose flags a filter
#: cannot read, answers ENOSYS, and the C library falls back to clone)
_NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, 0x02000000)
KEYCTL_JOIN_SESSION_KEYRING = 1
#: seconds between two counts of the sandbox's memory by its init
MEMORY_POLL_S = 0.05
_KEYCTL = {"x86_64": 250, "aarch64": 219}


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


def _errno_action(errno):
    return 0x00050000 | (errno & 0xFFFF)


def _load_libseccomp():
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


#: loaded before the new root exists (its /usr has the library too, but the boot maps it once)
_seccomp = _load_libseccomp()


def _install_filter(share_network):
    """The program's seccomp filter (inherited across exec, kept by no_new_privs): everything allowed but
    the calls of ``_DENIED_CALLS``, namespace clones and socket families outside ``_SOCKET_FAMILIES``."""
    if _seccomp is None:
        raise SetupError("seccomp: libseccomp (libseccomp.so.2) is not installed; install libseccomp2")
    ctx = _seccomp.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SetupError("seccomp: seccomp_init failed")

    def rule(call, errno, *cmps):
        nr = _seccomp.seccomp_syscall_resolve_name(call.encode())
        if nr < 0:
            return  # not a system call of this architecture
        array = (_ArgCmp * max(1, len(cmps)))(*cmps)
        ret = _seccomp.seccomp_rule_add_array(ctx, _errno_action(errno), nr, len(cmps), array)
        if ret < 0:
            raise SetupError(f"seccomp: adding the rule for {call} failed ({os.strerror(-ret)})")

    try:
        for call in _DENIED_CALLS:
            rule(call, EPERM)
        rule("clone3", ENOSYS)
        for flag in _NAMESPACE_FLAGS:
            rule("clone", EPERM, _ArgCmp(0, SCMP_CMP_MASKED_EQ, flag, flag))
        families = _SOCKET_FAMILIES + ((AF_NETLINK,) if share_network else ())
        for call in ("socket", "socketpair"):
            # above the largest allowed family (and every value with high bits set) ...
            rule(call, EAFNOSUPPORT, _ArgCmp(0, SCMP_CMP_GT, max(families), 0))
            # ... and every one below it that is not allowed
            for family in range(max(families)):
                if family not in families:
                    rule(call, EAFNOSUPPORT, _ArgCmp(0, SCMP_CMP_EQ, family, 0))
        ret = _seccomp.seccomp_load(ctx)
        if ret < 0:
            raise SetupError(f"seccomp: loading the filter failed ({os.strerror(-ret)})")
    finally:
        _seccomp.seccomp_release(ctx)


def _fresh_session_keyring():
    """A new anonymous session keyring, so nothing the caller's session keyring holds is reachable (the
    filter then refuses the keyring calls altogether). A kernel without keyrings has nothing to share."""
    nr = _KEYCTL.get(platform.machine())
    if nr is None:
        raise SetupError(f"keyrings: no keyctl system call number for {platform.machine()}")
    if _libc.syscall(nr, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        if err != ENOSYS:
            raise SetupError(f"keyrings: joining a fresh session keyring failed: {os.strerror(err)}")


class SetupError(Exception):
    """One isolation step failed; the message says which and why."""

    #: whether weaker isolation is the only way around it (else the caller's input is at fault)
    isolation_step = True


class ScratchFilesError(SetupError):
    """The caller's files do not fit in the scratch directory."""

    isolation_step = False


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what} failed: {os.strerror(err)} (errno {err})")


def _enc(value):
    return None if value is None else os.fsencode(value)


def _mount(source, target, fstype, flags, data, what=None):
    _check(_libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)), what or f"mount {target}")


def _syscall(name, *args):
    number = _SYSCALLS.get(platform.machine(), {}).get(name)
    if number is None:
        raise SetupError(f"{name} is not known on {platform.machine()}")
    return _libc.syscall(number, *args)


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


# ----- boot: namespaces -------------------------------------------------------------------------------


def _enter_namespaces(cfg, status):
    """New mount/PID/net/IPC/UTS namespaces (inside a user namespace mapping us to root if not root)."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    # Isolation(host_network=True) was asked for by name; a root caller's egress relay gets its network namespace
    # from the init, inside a user namespace of its own (_own_network_namespace)
    if not cfg.get("share_network") and not (cfg["root"] and cfg.get("relay")):
        flags |= CLONE_NEWNET
    if cfg["root"]:
        _check(_libc.unshare(flags), "unshare(mount, pid, net, ipc, uts namespaces)")
        status["user_namespace"] = False
        return
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(CLONE_NEWUSER | flags), "unshare(user, mount, pid, net, ipc, uts namespaces)")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    except OSError as exc:
        raise SetupError(f"mapping the caller to root in the new user namespace failed: {exc}") from exc
    status["user_namespace"] = True


# ----- init: the new root -------------------------------------------------------------------------------


def _opath(path):
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise SetupError(f"cannot open {path} to mount it into the sandbox: {exc.strerror}") from exc


def _mountpoint(target, is_dir):
    if is_dir:
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if not os.path.lexists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _set_attrs(target, attrs, what):
    """Add mount attributes to ``target`` and every mount below it (mount_setattr, Linux 5.12+)."""
    attr = _MountAttr(attr_set=attrs)
    ret = _syscall("mount_setattr", AT_FDCWD, _enc(target), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(
            f"making {what} read-only (mount_setattr) failed: {os.strerror(err)} (errno {err}); "
            "the sandbox needs Linux 5.12 or newer"
        )


def _bind(fd, target, *, attrs, what):
    """Bind the object behind ``fd`` (with its submounts) at ``target``, then add ``attrs`` to all."""
    _mountpoint(target, stat.S_ISDIR(os.fstat(fd).st_mode))
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC, None, f"bind-mounting {what}")
    _set_attrs(target, attrs, what)


def _build_root(cfg, status):
    """Assemble the new root on a tmpfs, pivot into it, detach the host's root."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "making the mount namespace private")
    ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
    # open every source before the staging tmpfs can cover it
    binds = []
    for source, target in cfg["binds"]:
        binds.append((_opath(source), target, source))
    devs = [(_opath(f"/dev/{name}"), name) for name in _DEV_NODES]
    system = []
    for path in cfg["system"]:
        if os.path.islink(path):
            system.append((None, path, os.readlink(path)))
        elif os.path.isdir(path):
            system.append((_opath(path), path, None))
    ld_cache = _opath("/etc/ld.so.cache") if os.path.isfile("/etc/ld.so.cache") else None
    staging = next((d for d in _STAGING_DIRS if os.path.isdir(d) and not os.path.islink(d)), None)
    if staging is None:
        raise SetupError(f"no directory to assemble the new root on (tried {', '.join(_STAGING_DIRS)})")
    _mount(
        "tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=0755", "mounting the root tmpfs"
    )
    root = staging

    def at(path):
        return root + path

    for fd, path, link in system:
        if link is not None:
            os.symlink(link, at(path))
        else:
            _bind(fd, at(path), attrs=ro, what=path)
    for fd, target, source in sorted(binds, key=lambda b: b[1].count("/")):
        _bind(fd, at(target), attrs=ro, what=f"{source} (read-only path)")
    for path in cfg["hide"]:  # the interpreter's own site-packages: only allow-listed packages exist
        if os.path.isdir(at(path)):
            _mount(
                "tmpfs",
                at(path),
                "tmpfs",
                MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "size=4k,nr_inodes=4,mode=0555",
                f"hiding {path}",
            )
    os.makedirs(at("/dev"), mode=0o755)
    for fd, name in devs:
        _bind(fd, at(f"/dev/{name}"), attrs=MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, what=f"/dev/{name}")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, at(f"/dev/{name}"))
    os.makedirs(at("/etc"), mode=0o755, exist_ok=True)  # the network files may be mounted under it already
    for name, text in cfg["etc"].items():
        _write(at(f"/etc/{name}"), text)
    if ld_cache is not None:
        _bind(ld_cache, at("/etc/ld.so.cache"), attrs=ro, what="/etc/ld.so.cache")
    os.makedirs(at(os.path.dirname(cfg["guard_path"])), mode=0o755, exist_ok=True)
    _write(at(cfg["guard_path"]), cfg["guard_source"])
    # the scratch directory: its own bounded tmpfs owned by the program's uid
    scratch = at(cfg["scratch"])
    os.makedirs(scratch, mode=0o755, exist_ok=True)
    owner = cfg["owner_in_ns"]
    _mount(
        "tmpfs",
        scratch,
        "tmpfs",
        MS_NOSUID | MS_NODEV | MS_NOEXEC,
        f"size={cfg['scratch_bytes']},nr_inodes={cfg['scratch_files']},mode=0700,uid={owner},gid={owner}",
        "mounting the scratch tmpfs",
    )
    # a fresh /proc of the new PID namespace (while the host's /proc is still visible: the kernel
    # refuses a new proc mount in a user namespace that has no fully visible one)
    os.makedirs(at("/proc"), mode=0o555)
    _mount("proc", at("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mounting /proc")
    for name in _PROC_READONLY:
        path = at(f"/proc/{name}")
        if os.path.exists(path):
            fd = _opath(path)
            _bind(fd, path, attrs=ro | MOUNT_ATTR_NOEXEC, what=f"/proc/{name}")
            os.close(fd)
    for fd in [b[0] for b in binds] + [d[0] for d in devs] + [s[0] for s in system if s[0] is not None]:
        os.close(fd)
    if ld_cache is not None:
        os.close(ld_cache)
    # pivot: the tmpfs becomes /, the host's root is stacked on it and then detached
    os.chdir(root)
    _check(_syscall("pivot_root", b".", b"."), "pivot_root into the new root")
    _check(_libc.umount2(b".", MNT_DETACH), "detaching the host's root")
    os.chdir("/")
    _mount(
        None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None, "making the new root read-only"
    )
    status["root"] = "pivot_root"


def _write_files(cfg):
    """Place the caller's files in the scratch directory, owned by the program's uid."""
    scratch = cfg["scratch"]
    owner = cfg["owner_in_ns"]
    for name, encoded in cfg["files"].items():
        dest = os.path.join(scratch, name)
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700)
            walk = parent
            while walk != scratch:
                os.chown(walk, owner, owner)
                walk = os.path.dirname(walk)
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(encoded))
        except OSError as exc:
            raise ScratchFilesError(
                f"cannot place {name!r} in the scratch directory ({exc.strerror}); "
                "raise Limits.scratch_bytes if the files are larger than the scratch"
            ) from exc
        os.chown(dest, owner, owner)


def _collect(cfg):
    """The requested scratch files (regular files only, never through a symlink), within the budget."""
    out, missing = {}, {}
    budget = cfg["collect_bytes"]
    for name in cfg["collect"]:
        parts = [p for p in name.split("/") if p]
        fd = None
        try:
            fd = os.open(cfg["scratch"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            for part in parts[:-1]:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            missing[name] = "not a regular file" if exc.errno in (40, 20) else f"not found ({exc.strerror})"
            continue
        finally:
            if fd is not None:
                os.close(fd)
        with os.fdopen(leaf, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                missing[name] = "not a regular file"
            elif info.st_size > budget:
                missing[name] = f"{info.st_size} bytes is over what is left of Limits.collect_bytes ({budget})"
            else:
                data = f.read(budget + 1)
                if len(data) > budget:
                    missing[name] = f"over what is left of Limits.collect_bytes ({budget})"
                else:
                    budget -= len(data)
                    out[name] = base64.b64encode(data).decode()
    return {"files": out, "missing": missing}


# ----- program: the last steps before exec ----------------------------------------------------------------


def _enter_inner_user_namespace(inner):
    """A second user namespace: the program's uid there is unprivileged and it has no capability in
    the namespace that owns its mounts, so it cannot unmount or remount its walls."""
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(user namespace) for the program")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{inner} 0 1")
        _write("/proc/self/gid_map", f"{inner} 0 1")
    except OSError as exc:
        raise SetupError(f"mapping the program's uid failed: {exc}") from exc
    os.setresgid(inner, inner, inner)
    os.setresuid(inner, inner, inner)


def _drop_bounding_set():
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap} from the bounding set")


def _drop_privileges(cfg):
    """Everything a process the sandbox runs gives up: its uid, every capability, new privileges; then the rlimits and
    (sandboxed) a fresh keyring and the system-call filter."""
    # the init made itself non-dumpable (so the program cannot ptrace it); its child must be
    # dumpable again to own its /proc/self files (uid_map) — exec would reset it anyway
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")
    if cfg["sandboxed"]:
        os.setsid()  # kill(0, ...) inside reaches only its own group
        if cfg["root"]:
            _drop_bounding_set()
            os.setgroups([])
            os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        else:
            _enter_inner_user_namespace(cfg["uid"])
            _drop_bounding_set()
    else:
        os.setpgid(0, 0)  # its own group, so the end of the run can kill what it started
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    for name, (soft, hard) in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if cfg["sandboxed"]:
        _fresh_session_keyring()
        _install_filter(cfg["share_network"])


def _program(cfg, status, status_fd):
    """The program's process: drop everything, exec the guard. Never returns."""
    try:
        _drop_privileges(cfg)
        os.chdir(cfg["scratch"])
        for sig in range(1, signal.NSIG):
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(sig, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        status["uid"] = os.getuid()
        guard = dict(cfg["guard"], status=status, status_fd=status_fd)
        os.execve(cfg["python"], [cfg["python"], "-I", "-u", cfg["guard_path"], json.dumps(guard)], cfg["env"])
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then a distinctive exit
        _report_error(status_fd, status, exc)
    os._exit(SETUP_FAILED_EXIT)


# ----- the egress relay ------------------------------------------------------------------------------------


def _loopback_up():
    """Bring up ``lo`` of the sandbox's own network namespace (it starts down; nothing else is there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0)))[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
        except OSError as exc:
            raise SetupError(f"bringing up the loopback interface for the egress relay failed: {exc}") from exc


def _own_network_namespace(report_w, map_r):
    """A root caller's sandbox with an egress relay: a new user namespace and, owned by it, the network namespace,
    so the init may bring its loopback up without CAP_NET_ADMIN over the host's (a sandbox-host container has none).
    The boot, in the parent user namespace, maps the program's uid into it (nothing else: the init keeps its
    capabilities inside only, its own uid unmapped)."""
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare(user, net namespaces) for the egress relay")
    os.write(report_w, b'{"map_uid": true}\n')
    ready, _, _ = select.select([map_r], [], [], RELAY_START_S)
    answer = os.read(map_r, 256) if ready else b""
    if answer != b"1":
        why = answer[1:].decode(errors="replace") if answer else "no answer"
        raise SetupError(f"mapping the program's uid into the egress relay's user namespace failed: {why}")


def _map_uid(cfg, proc_fd, map_w):
    """The boot's half of :func:`_own_network_namespace`: the program's uid and gid, one to one. ``proc_fd`` is the
    init's /proc directory, opened before the init's pivot_root (which moves the boot's root too: they share the mount
    namespace)."""
    uid = cfg["uid"]
    try:
        for name in ("uid_map", "gid_map"):
            fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=proc_fd)
            try:
                os.write(fd, f"{uid} {uid} 1".encode())
            finally:
                os.close(fd)
        os.write(map_w, b"1")
    except OSError as exc:
        os.write(map_w, b"0" + str(exc).encode()[:200])


def _start_relay(cfg, close_fds):
    """Fork the relay (before the program, so it listens when the program starts): as unprivileged as the program,
    it accepts on 127.0.0.1:PORT and carries each connection to the egress proxy's socket; the proxy outside decides
    what goes anywhere. Returns once it listens."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            for fd in close_fds:
                if fd is not None:
                    os.close(fd)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            _drop_privileges(cfg)
            _relay(cfg["relay"]["port"], cfg["relay"]["socket"], ready_w)
        finally:
            os._exit(0)
    os.close(ready_w)
    ready, _, _ = select.select([ready_r], [], [], RELAY_START_S)
    ok = bool(ready) and os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    if not ok:
        raise SetupError(
            f"the egress relay did not listen on 127.0.0.1:{cfg['relay']['port']} within {RELAY_START_S} s"
        )
    return pid


def _relay(port, path, ready_w):
    """The relay's loop (stdlib asyncio): bytes both ways, half-closes passed on, at most RELAY_CONNECTIONS."""
    import asyncio

    active = set()  # type: set[object]

    async def pipe(src, dst):
        try:
            while data := await src.read(1 << 16):
                dst.write(data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except OSError:
            dst.close()

    async def carry(reader, writer):
        if len(active) >= RELAY_CONNECTIONS:
            writer.close()
            return
        active.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            active.discard(writer)
            writer.close()
            return
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            active.discard(writer)
            writer.close()
            up_writer.close()

    async def main():
        server = await asyncio.start_server(carry, "127.0.0.1", port)
        os.write(ready_w, b"1")
        os.close(ready_w)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ----- init ---------------------------------------------------------------------------------------------------


def _init(cfg, status, status_fd, alive_r, report_w, result_fd, map_r):
    """PID 1 of the sandbox (or, with level none, the supervisor of the program). Never returns."""
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        if select.select([alive_r], [], [], 0)[0]:  # the boot died before PDEATHSIG was armed
            os._exit(SETUP_FAILED_EXIT)
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")  # no ptrace, no /proc/1/*
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        if map_r is not None:  # the boot holds our /proc directory before the pivot moves its root
            ready, _, _ = select.select([map_r], [], [], RELAY_START_S)
            if not ready or os.read(map_r, 1) != b"o":
                raise SetupError("the boot did not open the init's /proc directory")
        if cfg["sandboxed"]:
            _check(_libc.sethostname(b"sandbox", 7), "sethostname")
            _build_root(cfg, status)
        _write_files(cfg)
        if cfg.get("relay"):
            if cfg["root"]:
                _own_network_namespace(report_w, map_r)
                status["network_user_namespace"] = True  # the mounts' and PIDs' namespaces stay the caller's
            _loopback_up()
            _start_relay(cfg, (status_fd, alive_r, report_w, result_fd, map_r))
        pid = os.fork()
        if pid == 0:
            os.close(report_w)
            os.close(alive_r)
            if result_fd is not None:
                os.close(result_fd)
            if map_r is not None:
                os.close(map_r)
            _program(cfg, status, status_fd)
        os.close(status_fd)
    except BaseException as exc:  # noqa: BLE001
        _report_error(status_fd, status, exc)
        os._exit(SETUP_FAILED_EXIT)
    limit = cfg.get("sandbox_memory_bytes") if cfg["sandboxed"] else None
    # the caller's stderr, kept (by the init only) to say why it killed the sandbox for its memory
    err = os.dup(2) if limit else None
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # only the program holds the caller's pipes
        os.dup2(null, fd)
    os.write(report_w, (json.dumps({"program_pid": pid}) + "\n").encode())
    wait_status = None
    over = None
    while wait_status is None:
        try:
            done, ws = os.waitpid(-1, os.WNOHANG if limit and over is None else 0)
        except ChildProcessError:
            break
        if done == pid:
            wait_status = ws
        elif done == 0:  # nothing ended: count the namespace's memory, then look again shortly
            held = _namespace_private_bytes()
            if held > limit:
                over = held
                os.kill(-1, signal.SIGKILL)  # the whole sandbox: its processes together went over
            else:
                select.select([], [], [], MEMORY_POLL_S)
    # the program is gone: nothing it started may outlive it
    try:
        if cfg["sandboxed"]:
            os.kill(-1, signal.SIGKILL)  # from PID 1: every other process of the namespace
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    if result_fd is not None:
        try:
            payload = _collect(cfg) if wait_status is not None and os.WIFEXITED(wait_status) else {}
            with os.fdopen(result_fd, "w") as f:
                json.dump(payload, f)
        except OSError:
            pass
    if err is not None:
        if over is not None:  # read as the memory limit (like a MemoryError), not an unexplained kill
            message = (
                f"\nMemoryError: the sandbox's processes held {over} bytes together, over its limit of {limit}; "
                "all were killed\n"
            )
            try:
                os.write(err, message.encode())
            except OSError:
                pass
        os.close(err)
    os.write(report_w, (json.dumps({"wait_status": wait_status}) + "\n").encode())
    os._exit(0)


def _namespace_private_bytes():
    """Private resident memory of every process of the namespace but the init (``statm``: resident minus
    file-backed and shared pages; memfd and new tmpfs mounts are refused by the filter, the scratch tmpfs
    has its own size)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == "1":
            continue
        try:
            with open(f"/proc/{entry}/statm", "rb") as f:
                fields = f.read().split()
            total += (int(fields[1]) - int(fields[2])) * page
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total


# ----- boot ---------------------------------------------------------------------------------------------------


def _report_error(status_fd, status, exc):
    status["error"] = str(exc) if isinstance(exc, SetupError) else f"{type(exc).__name__}: {exc}"
    if status.get("level") == "namespaces" and getattr(exc, "isolation_step", True):
        status["error"] += "; " + _NO_FALLBACK
    try:
        os.write(status_fd, json.dumps(status).encode())
    except OSError:
        pass


def _read_fd(fd):
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _die_like(wait_status):
    """Exit the way the program did: same exit code, or the same signal."""
    if os.WIFEXITED(wait_status):
        os._exit(os.WEXITSTATUS(wait_status))
    sig = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else signal.SIGKILL
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is to be ignored


def _supervise(cfg, init_pid, life_fd, report_r, map_w=None, proc_fd=None):
    """Wait for the init's report, or for the parent to close the lifeline (then kill everything)."""
    buf = b""
    program_pid = None
    open_fds = [life_fd, report_r]
    while report_r in open_fds:
        ready, _, _ = select.select(open_fds, [], [])
        if life_fd in ready:
            os.kill(init_pid, signal.SIGKILL)
            if not cfg["sandboxed"] and program_pid:
                try:
                    os.killpg(program_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.waitpid(init_pid, 0)  # the namespace is empty once its init is reaped
            _die_like(int(signal.SIGKILL))  # the wait status of "killed by SIGKILL" is the signal number
        if report_r in ready:
            chunk = os.read(report_r, 1 << 16)
            if not chunk:
                open_fds.remove(report_r)
            buf += chunk
            for line in buf.split(b"\n")[:-1]:  # complete lines only
                if line.startswith(b'{"program_pid"'):
                    program_pid = json.loads(line)["program_pid"]
                elif line.startswith(b'{"map_uid"') and map_w is not None:
                    _map_uid(cfg, proc_fd, map_w)
                    os.close(map_w)
                    map_w = None  # once
    _, init_status = os.waitpid(init_pid, 0)
    for line in reversed(buf.split(b"\n")):
        if line.startswith(b'{"wait_status"'):
            wait_status = json.loads(line)["wait_status"]
            if wait_status is not None:
                _die_like(wait_status)
    if os.WIFEXITED(init_status):
        os._exit(os.WEXITSTATUS(init_status) or SETUP_FAILED_EXIT)
    _die_like(init_status)


def main():
    cfg_fd, status_fd, life_fd, result_arg = (int(a) for a in sys.argv[1:5])
    result_fd = None if result_arg < 0 else result_arg
    status = {}
    for fd in (life_fd, result_fd):
        if fd is not None:
            os.set_inheritable(fd, False)  # the init inherits them by fork; the program never does
    try:
        cfg = json.loads(_read_fd(cfg_fd))
        status.update(cfg["status"])
        if cfg["sandboxed"]:
            _enter_namespaces(cfg, status)
        alive_r, alive_w = os.pipe()
        report_r, report_w = os.pipe()
        map_r, map_w = os.pipe() if cfg["sandboxed"] and cfg["root"] and cfg.get("relay") else (None, None)
        init_pid = os.fork()
        if init_pid == 0:
            os.close(alive_w)
            os.close(report_r)
            os.close(life_fd)
            if map_w is not None:
                os.close(map_w)
            _init(cfg, status, status_fd, alive_r, report_w, result_fd, map_r)
        os.close(alive_r)
        os.close(report_w)
        proc_fd = None
        if map_r is not None and map_w is not None:
            os.close(map_r)
            proc_fd = os.open(f"/proc/{init_pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            os.write(map_w, b"o")  # the init may build its root now
        os.close(status_fd)
        if result_fd is not None:
            os.close(result_fd)
    except BaseException as exc:  # noqa: BLE001 - report every setup failure to the parent
        _report_error(status_fd, status, exc)
        os._exit(SETUP_FAILED_EXIT)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _supervise(cfg, init_pid, life_fd, report_r, map_w, proc_fd)


if __name__ == "__main__":
    main()
