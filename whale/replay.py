"""``whale replay``: one episode in which the model's replies are given, in order.

How a person debugs a verifier or a harness without a model: the item comes in the domain's raw
row format (``Domain.item_from_raw``; chess: the Lichess CSV columns), the harness is h0 unless
given, the replies are handed out one per model turn (extra replies unused; too few → empty replies).
The harness runs sandboxed, exactly as in a real run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from whale.domain import Domain
from whale.harness.process import HarnessProcess
from whale.harness.runner import EpisodeRunner, RunnerConfig
from whale.harness.validate import validate_file
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient


def replay(
    domain_name: str, item: dict[str, Any], replies: list[str], harness_path: Path | None = None
) -> dict[str, Any]:
    """The episode as JSON: the trace fields (``reward``, ``turns``, ``end``, ``messages``, ``steps``, ...)
    plus ``replies_used``. Raises ``whale.domain.DomainError`` for a bad item and
    ``whale.harness.validate.HarnessValidationError`` for a bad harness file."""
    from whale import domains

    return replay_domain(domains.load(domain_name), item, replies, harness_path)


def replay_domain(
    domain: Domain, item: dict[str, Any], replies: list[str], harness_path: Path | None = None
) -> dict[str, Any]:
    """:func:`replay` with a domain object (tests, library use)."""
    path = Path(harness_path) if harness_path is not None else domain.h0_path()
    validate_file(path, domain.allowed_imports)
    parsed = domain.item_from_raw(item)
    return asyncio.run(_replay(domain, parsed, list(replies), path))


async def _replay(domain: Domain, item: dict[str, Any], replies: list[str], path: Path) -> dict[str, Any]:
    client = ScriptedClient(replies)
    async with HarnessProcess(path, domain.allowed_imports) as harness:
        runner = EpisodeRunner(
            domain,
            harness,
            client,
            SamplingParams(temperature=0.0),
            RunnerConfig(max_concurrency=1, harness_label=str(path)),
        )
        episode = await runner.run_episode(item)
    return {**episode.to_dict(), "replies_used": client.used, "replies_given": len(replies)}
