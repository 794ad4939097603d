"""The controller's writer of ``control/serving.json``: what the shared inference server must serve.

Between phases the controller names the checkpoint a phase samples from; within a weight phase the
trainer names each step's synced weights (``whale.rsft.sync``, with a version). The weight-sync
sidecar acknowledges in ``control/served.json``; a controller starts a child only once it has.
"""

from __future__ import annotations

from whale.core import layout
from whale.store import Store


def serving(store: Store, run: str) -> str | object | None:
    """The checkpoint ``serving.json`` names now (None: the base model), or :data:`UNSET` when it has none."""
    raw = store.read_json_or_none(layout.serving_key(run))
    return raw.get("checkpoint") if isinstance(raw, dict) and "checkpoint" in raw else UNSET


#: no serving target written yet
UNSET = object()


def serve(store: Store, run: str, checkpoint: str | None) -> bool:
    """Make ``serving.json`` name ``checkpoint``; True when it changed (the server must load it)."""
    if serving(store, run) == checkpoint:
        return False
    store.write_json(layout.serving_key(run), {"checkpoint": checkpoint})
    return True
