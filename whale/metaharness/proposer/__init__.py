"""Proposer backends behind one interface (:class:`~whale.metaharness.proposer.base.Proposer`).

* ``openai`` — :class:`~whale.metaharness.proposer.openai_agent.OpenAIAgentProposer`, the built-in agent
  loop over any OpenAI-compatible chat API with tool calls;
* ``cli`` — :class:`~whale.metaharness.proposer.cli_agent.CLIAgentProposer`, an external agent command;
* ``replay`` — :class:`~whale.metaharness.proposer.replay.ReplayProposer`, recorded candidates.

:func:`from_spec` builds one from ``spec.harnessSearch.proposer``. The API key comes from the
environment variable named by ``apiKeySecret.env`` (the operator injects the Secret under that name;
default ``WHALE_PROPOSER_API_KEY``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from whale.metaharness.proposer.base import (
    Proposal,
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerReport,
    collect_candidates,
    task_prompt,
)

DEFAULT_KEY_ENV = "WHALE_PROPOSER_API_KEY"


def api_key_env(proposer_spec: Any) -> str | None:
    secret = getattr(proposer_spec, "api_key_secret", None)
    if secret is None:
        return None
    return secret.env or DEFAULT_KEY_ENV


def from_spec(proposer_spec: Any, environ: Mapping[str, str] | None = None) -> Proposer:
    """A proposer for ``spec.harnessSearch.proposer`` (``whale.spec.Proposer``)."""
    environ = os.environ if environ is None else environ
    backend = proposer_spec.backend
    key_env = api_key_env(proposer_spec)
    key = environ.get(key_env) if key_env else None
    if key_env and not key:
        raise ProposerError(
            f"the proposer API key is missing: set environment variable {key_env} "
            f"(Secret {proposer_spec.api_key_secret.name}/{proposer_spec.api_key_secret.key} on a cluster)"
        )
    if backend == "openai":
        from whale.metaharness.proposer.openai_agent import OpenAIAgentProposer, ProposerClient

        if not proposer_spec.base_url or not proposer_spec.model:
            raise ProposerError("proposer backend 'openai' needs spec.harnessSearch.proposer.baseUrl and .model")
        return OpenAIAgentProposer(ProposerClient(proposer_spec.base_url, proposer_spec.model, key))
    if backend == "cli":
        from whale.metaharness.proposer.cli_agent import CLIAgentProposer

        return CLIAgentProposer(proposer_spec.command or [], extra_env={key_env: key} if key_env and key else None)
    if backend == "replay":
        from whale.metaharness.proposer.replay import ReplayProposer

        return ReplayProposer(proposer_spec.script)
    raise ProposerError(f"unknown proposer backend {backend!r}; use openai, cli or replay")


__all__ = [
    "Proposal",
    "ProposalRequest",
    "Proposer",
    "ProposerError",
    "ProposerReport",
    "api_key_env",
    "collect_candidates",
    "from_spec",
    "task_prompt",
]
