"""A harness may offer the model only its domain's tools (``Domain.tool_specs``): a candidate that lists a
tool the domain does not have (a shell, another domain's search) is refused when it loads, before any
model call — whatever name or description it gives."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from whale.harness.process import HarnessProcess
from whale.harness.runner import EpisodeRunner
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient

DOMAIN = GuessNumberDomainDouble()
SECRET_7 = DOMAIN.items[0]


def tool(name: str) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": "anything", "parameters": {"type": "object", "properties": {}}},
    }


def harness(tmp_path: Path, tools: list[dict]) -> Path:
    path = tmp_path / "h.py"
    path.write_text(DOMAIN.h0_path().read_text() + f"\n    TOOLS = {tools!r}\n")
    return path


async def episode(path: Path, client: ScriptedClient):
    async with HarnessProcess(path, frozenset({"re"})) as process:
        return await EpisodeRunner(DOMAIN, process, client, SamplingParams()).run_episode(SECRET_7)


async def test_a_tool_the_domain_does_not_offer_is_refused_before_any_model_call(tmp_path: Path) -> None:
    client = ScriptedClient(["<guess>7</guess>"])
    done = await episode(harness(tmp_path, [tool("hint"), tool("shell")]), client)
    assert (done.end, done.reward, done.turns) == ("error", 0.0, 0)
    assert "TOOLS" in done.error and "'shell'" in done.error and "hint" in done.error
    assert client.prompts == []


async def test_the_domains_own_tools_may_be_listed_with_any_description(tmp_path: Path) -> None:
    done = await episode(harness(tmp_path, [tool("hint")]), ScriptedClient(["<guess>7</guess>"]))
    assert (done.end, done.reward, done.error) == ("env_done", 1.0, None)
