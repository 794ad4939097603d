"""Every `whale` command written in README.md and docs/*.md (code blocks and inline code) names a command the CLI
has and only options that command takes (synopses such as ``whale run FILE [--store DIR|s3://...]`` included),
so the docs' commands do not drift from the code. Running them is each command's own tests' business."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from whale.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", re.S)
COMMAND = re.compile(r"(?:\.venv/bin/)?whale\s+(.*)")
INLINE = re.compile(r"`(?:\.venv/bin/)?whale ([^`]+)`")
#: what stands for a command in prose: `whale COMMAND -h`, `.venv/bin/whale …`
PLACEHOLDERS = {"COMMAND", "…", "..."}


def commands(doc: Path) -> list[str]:
    """The `whale ...` lines of the doc's code blocks (continuations joined, comments cut) and inline code."""
    text = doc.read_text(encoding="utf-8")
    out = []
    for block in BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            match = COMMAND.match(line.split(" #")[0].strip())
            if match:
                out.append(match.group(1))
    outside = BLOCK.sub("", text)
    out += [m.group(1).replace("\\|", "|") for m in INLINE.finditer(outside)]  # a table cell escapes its pipes
    return out


def problems(line: str, group: Any) -> list[str]:
    """``group``: the CLI's command group (typer's own click, so duck-typed: ``commands``, ``params``)."""
    argv = shlex.split(line)
    if not argv or argv[0] in ("-h", "--help", "--version") or argv[0] in PLACEHOLDERS:
        return []
    command = group.commands.get(argv[0])
    if command is None:
        return [f"no command {argv[0]!r}"]
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    out = []
    for token in argv[1:]:
        if token == "--":  # what follows is the command's own arguments (`whale replay ... -- REPLY`)
            break
        name = token.lstrip("[").split("=")[0].rstrip("]").split("|")[0]
        if name.startswith("-") and not re.fullmatch(r"-\d.*", name) and name not in options:
            out.append(f"{argv[0]} has no option {name}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_whale_commands_of_the_docs_exist_with_their_options(doc: Path) -> None:
    group = typer.main.get_command(app)
    found = [(line, p) for line in commands(doc) for p in problems(line, group)]
    assert found == []


def test_the_check_sees_a_wrong_command_and_a_wrong_option() -> None:
    group = typer.main.get_command(app)
    assert problems("run x.yaml --stroe st", group) == ["run has no option --stroe"]
    assert problems("sumbit x.yaml", group) == ["no command 'sumbit'"]
    assert problems("run FILE [--store DIR|s3://...] [--timeout S] [--detach]", group) == []
    assert sum(len(commands(doc)) for doc in DOCS) > 100  # the docs do hold commands to check
