"""Proposer backends behind one interface (:class:`~whale.metaharness.proposer.base.Proposer`).

* ``openai`` — :class:`~whale.metaharness.proposer.openai_agent.OpenAIAgentProposer`, the built-in agent
  loop over any OpenAI-compatible chat API with tool calls;
* ``anthropic`` — :class:`~whale.metaharness.proposer.anthropic_agent.AnthropicAgentProposer`, the same
  loop over the Anthropic Messages API;
* ``cli`` — :class:`~whale.metaharness.proposer.cli_agent.CLIAgentProposer`, an external agent command
  run inside the sandbox;
* ``replay`` — :class:`~whale.metaharness.proposer.replay.ReplayProposer`, recorded candidates;
* ``mutate`` — :class:`~whale.metaharness.proposer.mutate.MutateProposer`, blind search over the incoming
  harness's declared knobs (no model, no key; seeded).

Both built-in loops (:mod:`~whale.metaharness.proposer.agent`) have the file tools
(:mod:`~whale.metaharness.proposer.workspace`) and the sandboxed ``run_candidate`` / ``run_shell``
(:mod:`~whale.metaharness.proposer.tools`).

:func:`from_spec` builds one from ``spec.experiment.harnessSearch.proposer``. The API key comes from the
environment variable named by ``apiKeySecret.env`` (the operator injects the Secret under that name;
default ``WHALE_PROPOSER_API_KEY``). :func:`spec_problems` (``whale validate``, the operator's create
path) and :func:`environment_problems` (``whale run``) refuse a proposer that cannot run before any
phase — and any GPU — is started.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from whale.core.egress import DEFAULT_ALLOW_HOSTS
from whale.metaharness.proposer.base import (
    Proposal,
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerReport,
    TokenMeter,
    collect_candidates,
    task_prompt,
)

DEFAULT_KEY_ENV = "WHALE_PROPOSER_API_KEY"
#: set in a cluster's search container: the directory shared with its proposer-agent container
#: (:mod:`whale.metaharness.proposer.agent_exchange`, which names it too)
AGENT_EXCHANGE_ENV = "WHALE_PROPOSER_AGENT_EXCHANGE"
#: backends that call a model API themselves (and so need its endpoint, model and key)
API_BACKENDS = ("openai", "anthropic")
_FIELD = "spec.experiment.harnessSearch.proposer"


class ProposerProblem(NamedTuple):
    """One reason the proposer cannot run: the manifest field to fix, and how."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _loopback(url: str) -> bool:
    """A URL on this machine (a local OpenAI-compatible server needs no key)."""
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def spec_problems(spec: Any) -> list[ProposerProblem]:
    """Why the proposer of ``spec`` (a ``WhaleRunSpec``) cannot run, read from the manifest alone (empty:
    it can, or the run never searches harnesses). ``whale validate`` and the operator's create path call
    it, so a missing endpoint, model or key Secret fails before any Job or GPU is asked for.

    ``openai`` needs ``model``, ``baseUrl`` and ``apiKeySecret`` (a ``baseUrl`` on loopback needs no key);
    ``anthropic`` needs ``model`` and ``apiKeySecret`` (``baseUrl`` defaults to Anthropic's API)."""
    if not spec.condition.searches_harness:
        return []
    proposer = spec.experiment.harness_search.proposer
    backend = proposer.backend
    out: list[ProposerProblem] = []
    if backend not in API_BACKENDS:
        return out
    if not proposer.model:
        example = "claude-opus-4-1" if backend == "anthropic" else "the name the endpoint serves"
        out.append(ProposerProblem(f"{_FIELD}.model", f"backend {backend} needs the model to ask ({example})"))
    if backend == "openai" and not proposer.base_url:
        out.append(
            ProposerProblem(
                f"{_FIELD}.baseUrl",
                "backend openai needs the endpoint: an OpenAI-compatible "
                "URL such as https://api.openai.com/v1 or http://vllm:8000/v1",
            )
        )
    keyless = backend == "openai" and bool(proposer.base_url) and _loopback(proposer.base_url)
    if proposer.api_key_secret is None and not keyless:
        out.append(
            ProposerProblem(
                f"{_FIELD}.apiKeySecret",
                f"backend {backend} needs the API key: a Secret "
                "{name, key} (and its environment variable `env` for `whale run`, default "
                f"{DEFAULT_KEY_ENV})",
            )
        )
    return out


def environment_problems(spec: Any, environ: Mapping[str, str] | None = None) -> list[ProposerProblem]:
    """What a local ``whale run`` of ``spec`` lacks on this machine: the API key's environment variable,
    the agent install paths a ``cli`` proposer mounts. Empty when the run never searches harnesses."""
    if not spec.condition.searches_harness:
        return []
    environ = os.environ if environ is None else environ
    proposer = spec.experiment.harness_search.proposer
    out: list[ProposerProblem] = []
    key_env = api_key_env(proposer)
    if key_env and proposer.backend != "replay" and not environ.get(key_env):
        secret = proposer.api_key_secret
        out.append(
            ProposerProblem(
                f"{_FIELD}.apiKeySecret.env",
                f"environment variable {key_env} is not set: "
                f"export it with the proposer's API key (on a cluster the Secret "
                f"{secret.name}/{secret.key} provides it)",
            )
        )
    if proposer.backend == "cli":
        for i, path in enumerate(proposer.read_paths):
            if not Path(path).exists():
                out.append(
                    ProposerProblem(
                        f"{_FIELD}.readPaths[{i}]",
                        f"{path} does not exist on this machine "
                        "(the agent's install, mounted read-only into its sandbox)",
                    )
                )
    return out


def api_key_env(proposer_spec: Any) -> str | None:
    secret = getattr(proposer_spec, "api_key_secret", None)
    if secret is None:
        return None
    return secret.env or DEFAULT_KEY_ENV


def from_spec(proposer_spec: Any, environ: Mapping[str, str] | None = None, seed: int | None = 0) -> Proposer:
    """A proposer for ``spec.experiment.harnessSearch.proposer`` (``whale.core.spec.Proposer``); ``seed``
    (``spec.experiment.harnessSearch.seed``) seeds the backends that draw at random (``mutate``) and the ``openai`` backend's
    requests (the API's ``seed``; the anthropic API and Claude Code take none)."""
    environ = os.environ if environ is None else environ
    backend = proposer_spec.backend
    key_env = api_key_env(proposer_spec)
    key = environ.get(key_env) if key_env else None
    # on a cluster a cli agent is started by the search Job's proposer-agent container, which alone holds its key
    exchange = environ.get(AGENT_EXCHANGE_ENV) if backend == "cli" else None
    if key_env and not key and not exchange:
        raise ProposerError(
            f"the proposer API key is missing: set environment variable {key_env} "
            f"(Secret {proposer_spec.api_key_secret.name}/{proposer_spec.api_key_secret.key} on a cluster)"
        )
    reply_tokens = getattr(proposer_spec, "max_reply_tokens", None) or 8192
    if backend == "openai":
        from whale.metaharness.proposer.openai_agent import OpenAIAgentProposer, ProposerClient

        if not proposer_spec.base_url or not proposer_spec.model:
            raise ProposerError(
                "proposer backend 'openai' needs spec.experiment.harnessSearch.proposer.baseUrl and .model"
            )
        return OpenAIAgentProposer(
            ProposerClient(proposer_spec.base_url, proposer_spec.model, key, seed=seed), reply_tokens=reply_tokens
        )
    if backend == "anthropic":
        from whale.metaharness.proposer.anthropic_agent import AnthropicAgentProposer, AnthropicClient

        if not key_env:
            raise ProposerError(
                "proposer backend 'anthropic' needs spec.experiment.harnessSearch.proposer.apiKeySecret"
            )
        return AnthropicAgentProposer(
            AnthropicClient(proposer_spec.base_url, proposer_spec.model or "", key or ""), reply_tokens=reply_tokens
        )
    if backend == "cli":
        from whale.metaharness.proposer.cli_agent import CLIAgentProposer

        if exchange:
            from whale.metaharness.proposer.agent_exchange import ExchangeLauncher

            return CLIAgentProposer(
                proposer_spec.command or [],
                model=getattr(proposer_spec, "model", None),
                effort=getattr(proposer_spec, "effort", None),
                network=getattr(proposer_spec, "network", "proxy"),
                launcher=ExchangeLauncher(Path(exchange)),
            )
        return CLIAgentProposer(
            proposer_spec.command or [],
            extra_env={key_env: key} if key_env and key else None,
            read_paths=tuple(getattr(proposer_spec, "read_paths", None) or ()),
            network=getattr(proposer_spec, "network", "proxy"),
            allow_hosts=tuple(getattr(proposer_spec, "allow_hosts", None) or DEFAULT_ALLOW_HOSTS),
            allow_private_hosts=tuple(getattr(proposer_spec, "allow_private_hosts", None) or ()),
            model=getattr(proposer_spec, "model", None),
            effort=getattr(proposer_spec, "effort", None),
        )
    if backend == "replay":
        from whale.metaharness.proposer.replay import ReplayProposer

        return ReplayProposer(proposer_spec.script)
    if backend == "mutate":
        from whale.metaharness.proposer.mutate import MutateProposer

        return MutateProposer(seed)
    raise ProposerError(f"unknown proposer backend {backend!r}; use openai, anthropic, cli, replay or mutate")


__all__ = [
    "AGENT_EXCHANGE_ENV",
    "API_BACKENDS",
    "Proposal",
    "ProposalRequest",
    "Proposer",
    "ProposerError",
    "ProposerProblem",
    "ProposerReport",
    "TokenMeter",
    "api_key_env",
    "collect_candidates",
    "environment_problems",
    "from_spec",
    "spec_problems",
    "task_prompt",
]
