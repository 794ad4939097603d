"""Fetch a tool service's files from the run's store before it starts (the init container of a tool
service's pod; ``whale.domain.ToolService.fetch``).

    python -m whale.tools.fetch STORE_URI KEY PATH [KEY PATH ...]

A ``KEY`` ending in ``/`` is a folder published with a ``COMPLETE`` marker (a prepared index): it is
fetched whole, and refused while the marker is missing. Files stream to disk (an index is tens of GB)
and land atomically, so a restarted init container skips what it already has.
"""

from __future__ import annotations

import sys
from pathlib import Path

COMPLETE = "COMPLETE"


def fetch(store, key: str, path: Path) -> Path:
    path = Path(path)
    if key.endswith("/"):
        if (path / COMPLETE).is_file():
            return path
        return store.download_dir(key.rstrip("/"), path, marker=COMPLETE)
    if path.is_file():
        return path
    return store.download_file(key, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or len(args) % 2 == 0:
        print("usage: python -m whale.tools.fetch STORE_URI KEY PATH [KEY PATH ...]", file=sys.stderr)
        return 2
    from whale.store import StoreError, open_store

    store = open_store(args[0])
    for key, path in zip(args[1::2], args[2::2], strict=True):
        try:
            fetch(store, key, Path(path))
        except StoreError as exc:
            print(
                f"fetch: {store.uri_for(key)} -> {path}: {exc} (the run's prepare Job puts it there; see its log)",
                file=sys.stderr,
            )
            return 1
        print(f"fetched {store.uri_for(key)} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
