"""What every workload does first: read its request, load its domain, and find the harness file it
runs under."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from whale import layout
from whale.protocol import PhaseKind, PhaseRequest
from whale.store import Store


def read_request(store: Store, run: str, phase: str, kind: PhaseKind,
                 error: type[Exception] = ValueError) -> PhaseRequest:
    """The controller's request for this phase; ``error`` (the workload's own type) when it is not
    a request of ``kind`` with its arguments."""
    key = layout.request_key(run, phase)
    request = PhaseRequest.model_validate(store.read_json(key))
    if request.kind is not kind or getattr(request, kind.value) is None:
        raise error(f"{key}: kind is {request.kind.value}, expected {kind.value} with `{kind.value}` args")
    return request


def load_domain(spec: Any, domain: Any = None) -> Any:
    """``domain`` when a caller (a test) passes one in, else the plugin ``spec.domain`` names; either
    way configured with ``spec.sandbox.isolation`` for its tools that run model-written code and with
    ``spec.verifier`` for how it scores."""
    if domain is None:
        from whale import domains  # lazily: the registry imports the installed domain plugins

        domain = domains.load(spec.domain)
    domain.configure_sandbox(spec.sandbox.isolation)
    domain.configure_verifier(spec.verifier)
    return domain


def harness_limits(spec: Any) -> Any:
    """The harness processes' limits, with ``spec.sandbox.isolation`` (warned about once when none)."""
    from whale.harness.sandbox import SandboxLimits, warn_if_unisolated

    warn_if_unisolated(spec.sandbox.isolation)
    return SandboxLimits(isolation=spec.sandbox.isolation)


def harness_file(store: Store, key: str | None, domain: Any, tmp: Path) -> Path:
    """The harness to run under: a store key (read in place on a local store), or the domain's h0."""
    if key is None:
        return domain.h0_path()
    local = store.local_path(key)
    if local is not None and Path(local).is_file():
        return Path(local)
    path = tmp / "harness.py"
    path.write_bytes(store.read_bytes(key))
    return path
