"""What every workload does first: read its request, load its domain, and find the harness file it
runs under."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from whale.core import layout
from whale.core.protocol import PhaseKind, PhaseProgress, parse_request
from whale.core.spec import WhaleRunSpec
from whale.store import Store, StoreError

log = logging.getLogger(__name__)

#: within one stage, the progress object is replaced at most this often (a new stage is written at once)
PROGRESS_INTERVAL_S = 2.0


def read_request(store: Store, run: str, phase: str, kind: PhaseKind, error: type[Exception] = ValueError) -> Any:
    """The controller's request for this phase (:data:`PhaseRequest`, tagged by kind); ``error`` (the
    workload's own type) when it is not a request of ``kind``."""
    key = layout.request_key(run, phase)
    raw = store.read_json(key)
    if isinstance(raw, dict) and raw.get("kind") != kind.value:
        raise error(f"{key}: kind is {raw.get('kind')}, expected {kind.value}")
    try:
        return parse_request(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise error(f"{key} is not a {kind.value} request: {where}: {err.get('msg')}") from None


def read_spec(store: Store, run: str, error: type[Exception] = ValueError) -> WhaleRunSpec:
    """The run's spec (``spec.json``, written by the controller before it launches any child), parsed once;
    ``error`` names the file and the field when it is missing or invalid."""
    key = layout.spec_key(run)
    raw = store.read_json_or_none(key)
    if raw is None:
        raise error(
            f"{store.uri_for(key)} is missing: the controller writes the run's spec there before it launches a workload"
        )
    try:
        return WhaleRunSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise error(f"{store.uri_for(key)}: spec.{where}: {err.get('msg')}") from None


def sampling_params(request: Any, spec: WhaleRunSpec) -> Any:
    """The request's resolved sampling with the run's chat-template variables."""
    from whale.inference.base import SamplingParams
    from whale.inference.factory import chat_template_kwargs

    return SamplingParams.from_spec(request.sampling, chat_template_kwargs=chat_template_kwargs(spec))


def load_domain(spec: Any, domain: Any = None, *, scores: bool = True) -> Any:
    """``domain`` when a caller (a test) passes one in, else the plugin ``spec.domain`` names; either
    way configured with ``spec.execution.sandbox.isolation`` for its tools that run model-written code and, where it
    ``scores`` episodes, with ``spec.experiment.verifier`` for how (the data preparation scores nothing: it needs no
    judge's key)."""
    if domain is None:
        from whale import plugins  # lazily: the registry imports the installed domain plugins

        domain = plugins.load(spec.domain)
    from whale.domain import for_run

    domain = for_run(domain, spec.experiment.domain_options)
    domain.configure_sandbox(spec.execution.sandbox.isolation)
    if scores:
        domain.configure_verifier(spec.experiment.verifier)
    return domain


def harness_limits(spec: Any) -> Any:
    """The harness processes' limits, with ``spec.execution.sandbox.isolation`` (warned about once when none) and the
    run's harness host when the operator configured one (``$WHALE_HARNESS_HOST``): the processes then start
    in the harness pod, not here. Level ``pod`` without a host fails closed (IsolationUnavailableError)."""
    from whale.harness.launch import (
        POD_WITHOUT_HOST,
        HarnessHost,
        IsolationUnavailableError,
        SandboxLimits,
        warn_if_unisolated,
    )

    host = HarnessHost.from_env(os.environ)
    if spec.execution.sandbox.isolation == "pod" and host is None:
        raise IsolationUnavailableError(POD_WITHOUT_HOST)
    warn_if_unisolated(spec.execution.sandbox.isolation)
    return SandboxLimits(isolation=spec.execution.sandbox.isolation, host=host)


def episode_bounds(spec: Any) -> Any:
    """``spec.execution.sandbox.episode`` as the episode runner takes it."""
    from whale.harness.runner import EpisodeBounds

    b = spec.execution.sandbox.episode
    return EpisodeBounds(
        max_actions=b.max_actions,
        max_message_bytes=b.max_message_bytes,
        max_episode_bytes=b.max_episode_bytes,
        timeout_s=float(b.timeout_seconds),
    )


def enforces_provenance(spec: Any) -> bool:
    """Whether an answer that is not model text scores 0 (``whale.harness.provenance``): always, unless the
    spec author turned the integrity walls off (``spec.experiment.harnessSearch.integrity.action: off``)."""
    return bool(spec.experiment.harness_search.integrity.action != "off")


def harness_file(store: Store, key: str | None, domain: Any, data: Any, tmp: Path) -> Path:
    """The harness to run under: a store key (read in place on a local store), or the domain's h0 for ``data``
    (``Domain.h0_path_for``: a task variant may have its own)."""
    if key is None:
        return Path(domain.h0_path_for(data))
    local = store.local_path(key)
    if local is not None and Path(local).is_file():
        return Path(local)
    path = tmp / "harness.py"
    path.write_bytes(store.read_bytes(key))
    return path


class ProgressWriter:
    """Replaces the phase's progress object (``layout.progress_key``, :class:`PhaseProgress`): at once when
    the stage, step, iteration or candidate changes, else at most every ``interval_s`` (``advance`` counts
    one more of ``done``). Progress is for people watching: a store error writing it is logged, never
    raised, so it cannot end a phase (the next metrics line or result write reports a broken store)."""

    def __init__(
        self,
        store: Store,
        run: str,
        phase: str,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store, self.key, self.interval_s, self.clock = store, layout.progress_key(run, phase), interval_s, clock
        self.current: PhaseProgress | None = None
        self._written: PhaseProgress | None = None
        self._written_at = float("-inf")

    def __call__(self, progress: PhaseProgress) -> None:
        self.current = progress
        self._write(force=not _same_place(progress, self._written))

    def advance(self, *_: object) -> None:
        """One more of ``done`` (a finished rollout); usable as an ``on_episode`` callback."""
        if self.current is not None and self.current.done is not None:
            self.current = self.current.model_copy(update={"done": self.current.done + 1})
            self._write(force=self.current.done == self.current.total)

    def _write(self, force: bool) -> None:
        now = self.clock()
        if self.current is None or (not force and now - self._written_at < self.interval_s):
            return
        try:
            self.store.write_json(self.key, self.current.to_wire())
        except StoreError as exc:
            log.warning("could not write the progress of %s: %s", self.key, exc)
            return
        self._written, self._written_at = self.current, now


def _same_place(a: PhaseProgress, b: PhaseProgress | None) -> bool:
    return b is not None and (a.stage, a.step, a.iteration, a.candidate) == (b.stage, b.step, b.iteration, b.candidate)
