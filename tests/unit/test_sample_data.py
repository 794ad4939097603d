"""The sample data ships inside the package (whale/data/sample): the default data root, checked file by file
against SHA256SUMS; gzipped files read as their plain name; the corpus unpacked once for readers that seek;
$WHALE_DATA_DIR and spec.experiment.data.dataDir still override; nothing in the project reads a folder beside it."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

import whale
from search_qa.data import corpus_path
from whale.core.spec import Data
from whale.domain import (
    SAMPLE_DATA_ROOT,
    DomainError,
    data_root,
    default_data_root,
    open_raw,
    raw_exists,
    raw_file,
    read_raw_jsonl,
    unpacked_raw_file,
)

PACKAGE = Path(whale.__file__).resolve().parent
REPO = PACKAGE.parent


def _sums() -> dict[str, str]:
    lines = (SAMPLE_DATA_ROOT / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {line[66:]: line[:64] for line in lines if line.strip()}


def test_the_default_root_is_the_sample_inside_the_package(monkeypatch):
    monkeypatch.delenv("WHALE_DATA_DIR", raising=False)
    assert default_data_root() == SAMPLE_DATA_ROOT == PACKAGE / "data" / "sample"
    assert {p.name for p in SAMPLE_DATA_ROOT.iterdir() if p.is_dir()} == {
        "chess_puzzles",
        "math_reasoning",
        "search_qa",
    }
    assert (SAMPLE_DATA_ROOT / "README.md").is_file()


def test_every_shipped_file_has_its_recorded_content():
    sums = _sums()
    assert len(sums) == 21
    for name, digest in sums.items():
        h = hashlib.sha256()
        with open_raw(SAMPLE_DATA_ROOT / name) as fh:
            h.update(fh.read().encode("utf-8"))
        assert h.hexdigest() == digest, name
    shipped = {
        str(p.relative_to(SAMPLE_DATA_ROOT)).removesuffix(".gz")
        for p in SAMPLE_DATA_ROOT.rglob("*")
        if p.is_file() and p.name not in ("README.md", "SHA256SUMS")
    }
    assert shipped == set(sums)  # no file without a checksum, no checksum without a file


def test_the_readme_lists_the_provenance_of_every_file():
    readme = (SAMPLE_DATA_ROOT / "README.md").read_text(encoding="utf-8")
    for name in _sums():
        assert Path(name).name in readme, name
    for commit in ("2e23cd6d67575978cec5fa697b852838ef6ab2ee", "a6694e2ebfa1a3fcbbbe4a5607f6317ba70ddc40"):
        assert commit in readme


def test_a_gzipped_file_reads_as_its_plain_name_and_a_plain_one_wins(tmp_path):
    plain = tmp_path / "rows.jsonl"
    with gzip.open(tmp_path / "rows.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "packed"}) + "\n\n")
    assert raw_exists(plain) and raw_file(plain).name == "rows.jsonl.gz"
    assert read_raw_jsonl(plain, "x") == [{"id": "packed"}]
    plain.write_text(json.dumps({"id": "plain"}) + "\n", encoding="utf-8")
    assert raw_file(plain) == plain and read_raw_jsonl(plain, "x") == [{"id": "plain"}]


def test_a_broken_or_missing_file_names_itself_and_the_fix(tmp_path):
    with gzip.open(tmp_path / "bad.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write('{"id": 1}\n{not json\n')
    with pytest.raises(DomainError, match=r"bad\.jsonl\.gz:2: not valid JSON"):
        read_raw_jsonl(tmp_path / "bad.jsonl", "x")
    with pytest.raises(DomainError, match=r"gone\.jsonl: missing.*dataDir.*WHALE_DATA_DIR.*sample data"):
        read_raw_jsonl(tmp_path / "gone.jsonl", "x")
    assert not raw_exists(tmp_path / "gone.jsonl")


def test_the_corpus_is_unpacked_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path / "cache"))
    packed = SAMPLE_DATA_ROOT / "search_qa" / "corpus" / "wiki_passages.jsonl.gz"
    assert packed.is_file() and not packed.with_suffix("").exists()
    path = corpus_path(SAMPLE_DATA_ROOT)
    assert path.is_relative_to(tmp_path / "cache" / "data") and path.name == "wiki_passages.jsonl"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == _sums()["search_qa/corpus/wiki_passages.jsonl"]
    mtime = path.stat().st_mtime_ns
    assert corpus_path(SAMPLE_DATA_ROOT) == path and path.stat().st_mtime_ns == mtime  # not unpacked again
    assert [p.name for p in path.parent.iterdir()] == ["wiki_passages.jsonl"]  # no temporary left behind


def test_a_changed_packed_file_is_unpacked_again_and_a_plain_one_is_used_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path / "cache"))
    target = tmp_path / "root" / "c.jsonl"
    target.parent.mkdir()
    for text in ("one\n", "two\n"):
        (tmp_path / "root" / "c.jsonl.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        assert unpacked_raw_file(target).read_text() == text
    target.write_text("plain\n")
    assert unpacked_raw_file(target) == target


def test_the_environment_and_the_spec_override_the_sample(tmp_path, monkeypatch):
    monkeypatch.setenv("WHALE_DATA_DIR", str(tmp_path / "env"))
    assert default_data_root() == tmp_path / "env"
    assert data_root(Data()) == tmp_path / "env"
    assert data_root(Data(data_dir=str(tmp_path / "spec"))) == tmp_path / "spec"


def test_nothing_in_the_project_reads_a_folder_beside_the_checkout():
    needle = "shared" + "/data"  # split, so this file does not find itself
    roots = ["whale", "domains", "operator", "tests", "docs", "benchmarks", "manifests", "chart", "images"]
    files = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml"]
    files += [p for root in roots for p in (REPO / root).rglob("*") if p.is_file()]
    suffixes = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".json", ".sh", ""}
    hits = [
        str(p.relative_to(REPO))
        for p in files
        if p.suffix in suffixes and "__pycache__" not in p.parts and needle in p.read_text(errors="replace")
    ]
    assert hits == []
