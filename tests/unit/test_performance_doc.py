"""docs/performance.md is a reference: every figure in its tables of current figures names the raw result it was
read from (a JSON file under benchmarks/results/ and the path of the value inside it), and says what that file
says, to the digits shown. A re-run that changes a raw file without the page fails here, as does a figure typed in
without a file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "benchmarks" / "results"
#: a source cell: `file.json` `path.to.value` (keys by dots, list items by index)
SOURCE = re.compile(r"`([\w.-]+\.json)` `([^`]+)`")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
HEADING = "## Current figures"


def _rows() -> list[tuple[str, str, str]]:
    """(value cell, file, path) of every table row under the current-figures heading."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    out = []
    for line in text[start : end if end > 0 else None].splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        source = SOURCE.search(cells[-1])
        if source:
            out.append((cells[1], source.group(1), source.group(2)))
    return out


def _at(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


ROWS = _rows()


def test_the_page_has_figures_and_every_table_row_names_its_source() -> None:
    assert len(ROWS) >= 30
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(HEADING) : text.find("\n## ", text.index(HEADING) + 1)]
    table_rows = [r for r in section.splitlines() if r.startswith("|") and not r.startswith("|---")]
    headers = [r for r in table_rows if r.startswith("| figure")]
    assert len(table_rows) - len(headers) == len(ROWS), "a row without `file.json` `path`"


@pytest.mark.parametrize("value, source, path", ROWS, ids=[f"{s}:{p}" for _, s, p in ROWS])
def test_each_figure_is_what_its_raw_result_says(value: str, source: str, path: str) -> None:
    raw = _at(json.loads((RESULTS / source).read_text()), path)
    shown = NUMBER.search(value)
    assert shown, f"{value!r}: no number"
    digits = shown.group(0).replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    measured = float(raw) * (100 if "%" in value else 1)
    assert abs(measured - float(digits)) <= 0.5 * 10**-decimals + 1e-12, f"{source} {path} = {raw}, shown {value}"
