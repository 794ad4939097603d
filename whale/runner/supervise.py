"""Workload supervisor: ``python -I -S supervise.py --watch-fd N --grace S -- ARGV...``.

The local runner starts every workload through this launcher, so that no process of a run outlives
its runner, however the runner ends (Ctrl-C, SIGTERM, --timeout, a crash, or SIGKILL):

* It is a child subreaper (``PR_SET_CHILD_SUBREAPER``): every process the workload starts — harness
  sandboxes that ``setsid()`` out of its group or drop to another uid included — is re-parented to it
  when its own parent dies, so all of them stay in its tree, where it can find and kill them.
* It watches a pipe whose only write end the runner holds. The kernel closes that end when the runner
  dies, even by SIGKILL; at EOF the supervisor SIGKILLs its whole tree and exits. A pipe rather than
  ``PR_SET_PDEATHSIG`` on the supervisor: the death signal fires when the *thread* that forked the
  child exits, not the process, and a runner may launch from any thread.
* The workload gets ``PR_SET_PDEATHSIG=SIGKILL`` towards this process (single-threaded, so that
  caveat does not apply), set between fork and exec and checked against ``getppid()`` to close the
  race with the supervisor dying first.
* SIGTERM/SIGINT/SIGHUP (the runner stopping the phase) are forwarded to the workload, which is
  SIGKILLed after ``--grace`` seconds.
* When the workload exits, whatever it left running is killed, and the supervisor exits the way the
  workload did (a death by signal is re-raised on itself), so the runner sees the workload's own end.

Stdlib only, started with ``-I -S`` (like ``whale/sandbox/_boot.py``): it starts in milliseconds and
imports nothing of the project.
"""

import ctypes
import os
import select
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
EXEC_FAILED = 127
POLL_S = 0.5
SWEEP_DEADLINE_S = 10.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _say(text):
    os.write(2, f"whale supervisor [{os.getpid()}]: {text}\n".encode("utf-8", "replace"))


def _prctl(option, value):
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def _tree(root):
    """(live descendants, zombie descendants) of ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    state: dict[int, bytes] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs (not Linux): only the direct child is known, and it is waited for
        return [], []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        pid = int(entry)
        state[pid] = fields[0]
        children.setdefault(int(fields[1]), []).append(pid)
    live: list[int] = []
    zombies: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            (zombies if state.get(child) in (b"Z", b"X") else live).append(child)
            todo.append(child)
    return live, zombies


def _reap(keep=None):
    """Reap exited children (orphans re-parented here) except ``keep``; returns keep's status if it ended."""
    kept = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return kept
        if pid == 0:
            return kept
        if pid == keep:
            kept = status


def kill_tree(me, keep=None):
    """SIGKILL every descendant until none is left (bounded). Returns keep's wait status if reaped here."""
    kept = None
    deadline = time.monotonic() + SWEEP_DEADLINE_S
    while True:
        status = _reap(keep)
        kept = status if status is not None else kept
        live, _ = _tree(me)
        if not live:
            return kept
        if time.monotonic() > deadline:
            _say(f"could not kill {len(live)} process(es): {live[:10]}")
            return kept
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _exit_like(status):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv):
    try:
        sep = argv.index("--")
        opts, command = argv[:sep], argv[sep + 1 :]
        watch_fd = int(opts[opts.index("--watch-fd") + 1])
        grace_s = float(opts[opts.index("--grace") + 1])
    except (ValueError, IndexError):
        _say("usage: supervise.py --watch-fd N --grace SECONDS -- ARGV...")
        return 2
    if not command:
        _say("no command given")
        return 2
    me = os.getpid()
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        _say("PR_SET_CHILD_SUBREAPER is not available here: processes that leave the workload's group may outlive it")
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_w, False)
    signal.set_wakeup_fd(sig_w)
    received = []
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd wakes select when it exits

    pid = os.fork()
    if pid == 0:  # the workload
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:  # the supervisor died before the death signal was armed
                os._exit(EXEC_FAILED)
            signal.set_wakeup_fd(-1)
            for sig in (*FORWARDED, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            for fd in (watch_fd, sig_r, sig_w):
                os.close(fd)
            os.execvp(command[0], command)
        except BaseException as exc:  # noqa: BLE001 - the child must never return into the supervisor
            _say(f"cannot start {command[0]!r}: {exc}")
        os._exit(EXEC_FAILED)

    status = None
    kill_at = None
    while status is None:
        if received and kill_at is None:
            try:
                os.kill(pid, received[0])
            except ProcessLookupError:
                pass
            kill_at = time.monotonic() + grace_s
        timeout = POLL_S
        if kill_at is not None:
            left = kill_at - time.monotonic()
            if left <= 0:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                left = POLL_S
            timeout = min(POLL_S, left)
        ready, _, _ = select.select([watch_fd, sig_r], [], [], timeout)
        if sig_r in ready:
            os.read(sig_r, 4096)
        if watch_fd in ready and not os.read(watch_fd, 1):
            _say("the runner is gone: killing the workload and everything it started")
            kill_tree(me, keep=pid)
            os._exit(128 + signal.SIGKILL)
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        status = wait_status if done else _reap(keep=pid)
    live, _ = _tree(me)
    if live:
        _say(f"the workload left {len(live)} process(es) running: killing them")
    kill_tree(me)
    _exit_like(status)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
