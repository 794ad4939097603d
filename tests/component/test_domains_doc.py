"""docs/domains.md's minimal domain is a working plugin: its files, written out of the page and installed
with an entry point, load through the registry, keep to the plugin API, and run an episode of their h0
in the real sandboxed harness runtime (a scripted model: the model is not what is under test)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from whale import plugins
from whale.domain import Data, Domain
from whale.harness.process import HarnessProcess
from whale.harness.runner import EpisodeRunner
from whale.harness.validate import validate_file
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient

DOC = Path(__file__).resolve().parents[2] / "docs" / "domains.md"
FILE_BLOCK = re.compile(r"<!-- file: (?P<path>[\w./]+) -->\n```\w*\n(?P<body>.*?)\n```", re.DOTALL)
ENTRY_POINT = re.compile(r'\[project\.entry-points\."whale\.domains"\]\n(?P<name>\w+) = "(?P<target>[\w.:]+)"')


def example_files() -> dict[str, str]:
    return {m["path"]: m["body"] + "\n" for m in FILE_BLOCK.finditer(DOC.read_text(encoding="utf-8"))}


@pytest.fixture
def echo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Domain:
    """The example installed as a plugin: its package and a dist-info with the page's entry point."""
    for rel, body in example_files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body, encoding="utf-8")
    entry = ENTRY_POINT.search(DOC.read_text(encoding="utf-8"))
    assert entry is not None, "docs/domains.md shows no whale.domains entry point"
    info = tmp_path / "echo_domain-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-domain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[whale.domains]\n{entry['name']} = {entry['target']}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "echo_domain", raising=False)
    importlib.invalidate_caches()
    assert entry["name"] in plugins.available()
    return plugins.load(entry["name"])


def test_the_page_shows_the_three_files_of_the_package() -> None:
    assert set(example_files()) == {"echo_domain/__init__.py", "echo_domain/h0.py", "echo_domain/SKILL.md"}


def test_the_example_imports_only_the_plugin_api() -> None:
    allowed = {"echo_domain/__init__.py": {"whale.domain"}, "echo_domain/h0.py": {"whale.harness.api"}}
    for rel, body in example_files().items():
        if not rel.endswith(".py"):
            continue
        tree = ast.parse(body)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert {n for n in names if n.split(".")[0] == "whale"} <= allowed[rel], rel


def test_the_example_loads_through_the_registry_and_sizes_its_splits(echo: Domain) -> None:
    assert isinstance(echo, Domain) and echo.name == "echo"
    data = Data.model_validate({"seed": 3, "harnessSize": 8})
    sizes = echo.split_sizes(data)
    assert sizes == {"weight": 64, "harness": 8, "test": 16}
    for split, size in sizes.items():
        items = echo.load_split(split, data)
        assert len(items) == size and len({i["id"] for i in items}) == size
        assert items == echo.load_split(split, data)  # a fixed order
    assert echo.skill_path().read_text().startswith("# Echo domain")


async def test_the_examples_h0_passes_the_gate_and_runs_an_episode_in_the_sandbox(echo: Domain) -> None:
    validate_file(echo.h0_path(), echo.allowed_imports)
    item = echo.load_split("test", Data())[0]
    async with HarnessProcess(echo.h0_path(), echo.allowed_imports) as harness:
        right = await EpisodeRunner(
            echo, harness, ScriptedClient([f" {item['answer']}\n"]), SamplingParams()
        ).run_episode(item)
        wrong = await EpisodeRunner(echo, harness, ScriptedClient(["no"]), SamplingParams()).run_episode(item)
    assert (right.reward, right.end, right.error) == (1.0, "env_done", None)
    assert wrong.reward == 0.0
    assert right.messages[1] == {"role": "user", "content": f"Repeat: {item['word']}"}


def test_every_name_of_the_plugin_api_resolves() -> None:
    """whale.domain re-exports services lazily: a renamed core module must fail here, not in a domain."""
    import whale.domain

    missing = [name for name in whale.domain.__all__ if getattr(whale.domain, name, None) is None]
    assert missing == []


def test_loading_the_domains_imports_no_engine_or_client() -> None:
    code = (
        "import sys, chess_puzzles, math_reasoning, search_qa, synthetic\n"
        "print(sorted(m for m in ('torch', 'transformers', 'httpx', 'faiss', 'minio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
