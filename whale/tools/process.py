"""Ending a child process the tool services and their tests start: SIGTERM, a bounded wait, then SIGKILL."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Ask ``proc`` to end (SIGTERM); if it has not within ``grace_s``, kill it (SIGKILL) and reap it, bounded too."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)
