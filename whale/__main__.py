"""The `whale` command's entry point (and `python -m whale`).

`whale --version` is answered here, before the command line (typer, rich, pydantic and the spec: most of a
second on a loaded machine) is imported; everything else goes to :func:`whale.cli.main`. typer's own
``--version`` option stays (``whale --version`` among other arguments still works and shows in ``-h``).
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from whale import version

        print(f"whale {version()}")
        return
    from whale.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
