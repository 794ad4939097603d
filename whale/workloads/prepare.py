"""Prepare workload: materialise the run's data splits and record their sizes
(``python -m whale.workloads prepare --store URI --run RUN --phase prepare``).

The operator has no data, yet ``decide()`` needs |D_weight|, |D_harness|, |D_test| to resolve the
schedule. Before anything else it writes the run's spec to ``layout.spec_key`` and launches this
workload, which loads the domain, lets it put what its tool services fetch into the store
(``Domain.prepare_store``: the search_qa retriever's corpus or e5 index), loads each split through ``Domain.load_split(split, data, store)``
(domains that cache materialised splits in the store, like chess_puzzles, write them there now, so
later Jobs re-use them) and writes ``layout.split_sizes_key`` LAST: its presence means "prepared".
The local runner writes the same file itself. Idempotent: a second run rewrites identical sizes.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from whale import layout
from whale.domain import SPLITS
from whale.spec import WhaleRunSpec
from whale.store import Store
from whale.workloads.common import load_domain

log = logging.getLogger(__name__)


class PrepareError(RuntimeError):
    """The run's data cannot be prepared; the message names the file or field and the fix."""


def read_spec(store: Store, run: str) -> WhaleRunSpec:
    key = layout.spec_key(run)
    raw = store.read_json_or_none(key)
    if raw is None:
        raise PrepareError(f"{store.uri_for(key)} is missing: the controller writes the run's spec there "
                           "before it launches the prepare workload")
    try:
        return WhaleRunSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise PrepareError(f"{store.uri_for(key)}: spec.{where}: {err.get('msg')}") from None


def split_sizes(domain: Any, spec: WhaleRunSpec, store: Store) -> dict[str, int]:
    """Load (and so materialise) every split; the sizes are what the workloads will see. They must
    agree with ``Domain.split_sizes`` (what ``whale plan`` and the local runner use)."""
    loaded = {split: len(domain.load_split(split, spec.data, store)) for split in SPLITS}
    declared = {k: int(v) for k, v in domain.split_sizes(spec.data).items()}
    if declared != loaded:
        raise PrepareError(
            f"domain {spec.domain!r}: split_sizes() says {declared} but load_split() returned {loaded} items; "
            "the domain plugin must make them agree (check spec.data caps and the data files)")
    if not loaded["weight"] or not loaded["test"]:
        raise PrepareError(f"domain {spec.domain!r} has an empty split ({loaded}); check spec.data")
    return loaded


def main(store: Store, run: str, phase: str = "prepare", *, domain: Any = None) -> dict[str, int]:
    """The workload; ``phase`` is unused (one prepare per run); ``domain`` may be injected (tests)."""
    spec = read_spec(store, run)
    domain = load_domain(spec, domain)
    domain.prepare_store(spec.data, store)  # what the run's tool services fetch (a retriever's index)
    sizes = split_sizes(domain, spec, store)
    store.write_json(layout.split_sizes_key(run), sizes)  # last: presence = prepared
    log.info("run %s: domain %s prepared, split sizes %s", run, spec.domain, sizes)
    return sizes
