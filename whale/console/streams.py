"""The consoles the command line prints through, and how it names itself in the commands it prints."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from rich.console import Console

#: columns of output that goes to a pipe or a file: rich's default there is 80, which cuts a table's cells;
#: a table takes only the width its cells need, so this is a ceiling, not a padding
PIPED_WIDTH = 1000


def cli_console(stderr: bool = False) -> Console:
    """A console that soft-wraps text and, when its stream is not a terminal and ``$COLUMNS`` is unset, does
    not cut tables at 80 columns (``whale list | less``, a CI log)."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty()) and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, soft_wrap=True, width=PIPED_WIDTH if piped else None)


def invoked_as(argv0: str | None = None) -> str:
    """`whale` as the person invoked it, so that a printed command can be pasted back: ``.venv/bin/whale`` (the
    README's form) stays that; ``whale`` from the PATH, ``python -m whale.cli`` and anything else print
    ``whale``."""
    arg = sys.argv[0] if argv0 is None and sys.argv else (argv0 or "")
    return shlex.quote(arg) if Path(arg).name == "whale" else "whale"
