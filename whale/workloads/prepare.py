"""Prepare workload: materialise the run's data splits and record their sizes
(``python -m whale.workloads prepare --store URI --run RUN --phase prepare``).

The operator has no data, yet ``decide()`` needs |D_weight|, |D_harness|, |D_test| to resolve the
schedule. Before anything else it writes the run's spec to ``layout.spec_key`` and launches this
workload, which loads the domain, lets it put what its tool services fetch into the store
(``Domain.prepare_store``: the search_qa retriever's corpus or e5 index), loads each split through ``Domain.load_split(split, data, store)``
(domains that cache materialised splits in the store, like chess_puzzles, write them there now, so
later Jobs re-use them) and writes ``layout.split_sizes_key`` LAST: its presence means "prepared".
The local runner writes the same file itself. Idempotent: a second run rewrites identical sizes.

With ``spec.experiment.data.source: full`` it first fetches the domain's full datasets (resumable, SHA-256 checked)
into the store and writes the paper-sized splits there (``whale.data.full``); the workloads then read
those. :func:`prepare_data` is the same preparation without a run, for ``whale prepare``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale.core import layout
from whale.core.spec import WhaleRunSpec
from whale.domain import SPLITS
from whale.store import Store
from whale.workloads import common
from whale.workloads.common import load_domain

log = logging.getLogger(__name__)


class PrepareError(RuntimeError):
    """The run's data cannot be prepared; the message names the file or field and the fix."""


def read_spec(store: Store, run: str) -> WhaleRunSpec:
    return common.read_spec(store, run, PrepareError)


def split_sizes(domain: Any, spec: WhaleRunSpec, store: Store) -> dict[str, int]:
    """Load (and so materialise) every split; the sizes are what the workloads will see. They must
    agree with ``Domain.split_sizes`` (what ``whale plan`` and the local runner use)."""
    loaded = {split: len(domain.load_split(split, spec.experiment.data, store)) for split in SPLITS}
    declared = {k: int(v) for k, v in domain.split_sizes(spec.experiment.data).items()}
    if declared != loaded:
        raise PrepareError(
            f"domain {spec.domain!r}: split_sizes() says {declared} but load_split() returned {loaded} items; "
            "the domain plugin must make them agree (check spec.experiment.data caps and the data files)"
        )
    if not loaded["weight"] or not loaded["test"]:
        raise PrepareError(f"domain {spec.domain!r} has an empty split ({loaded}); check spec.experiment.data")
    return loaded


@dataclass(frozen=True)
class Prepared:
    """What one preparation produced."""

    sizes: dict[str, int]
    #: per source of the full data: what was fetched, resumed or re-used (empty for source: sample)
    sources: list[Any] = field(default_factory=list)
    #: the full splits' manifest (None for source: sample)
    manifest: dict[str, Any] | None = None


def prepare_data(
    domain: Any,
    spec: WhaleRunSpec,
    store: Store,
    *,
    tool_data: bool = True,
    cache_dir: Path | None = None,
    fetch: Callable[..., Any] | None = None,
) -> Prepared:
    """Everything a run of ``spec`` reads from the store, with no run: the full datasets and their splits
    (``source: full``), the tool services' data (``Domain.prepare_store``, unless ``tool_data`` is False: it may
    read a split, the environment service's D_harness), then every split loaded once and its size checked
    against the plugin's."""
    reports: list[Any] = []
    manifest = None
    if spec.experiment.data.source == "full":
        from whale.data import full

        extra = {"fetch": fetch} if fetch is not None else {}
        manifest, reports = full.materialise(
            store, domain.require_full_data(), spec.experiment.data, cache_dir, **extra
        )
    if tool_data:
        domain.prepare_store(spec.experiment.data, store)  # what the run's tool services fetch (a retriever's index)
    return Prepared(split_sizes(domain, spec, store), reports, manifest)


def main(store: Store, run: str, phase: str = "prepare", *, domain: Any = None) -> dict[str, int]:
    """The workload; ``phase`` is unused (one prepare per run); ``domain`` may be injected (tests)."""
    spec = read_spec(store, run)
    domain = load_domain(spec, domain, scores=False)
    sizes = prepare_data(domain, spec, store).sizes
    store.write_json(layout.split_sizes_key(run), sizes)  # last: presence = prepared
    log.info("run %s: domain %s prepared, split sizes %s", run, spec.domain, sizes)
    return sizes
