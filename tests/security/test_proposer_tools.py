"""The proposer's file tools against an untrusted agent: every call does bounded work.

The tools run inside the proposer's event loop, so one call that hangs (a catastrophically
backtracking pattern, a read of a multi-gigabyte file, a walk of a huge tree) would hang the whole
harness phase past the proposer's timeout. Each test asserts the tool's answer; the pytest-timeout
is what catches a hang (``(a+)+$`` on this line takes longer than the age of the universe with a
backtracking engine).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from whale.metaharness.proposer.base import MAX_RATIONALE_BYTES
from whale.metaharness.proposer.workspace import (
    GREP_LIMIT,
    GREP_MAX_BYTES,
    GREP_MAX_PATTERN_CHARS,
    LIST_LIMIT,
    LIST_SCAN_LIMIT,
    READ_LIMIT_CHARS,
    READ_MAX_OFFSET_CHARS,
    Workspace,
)

EVIL_LINE = "a" * 100_000 + "!"


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    root = tmp_path / "archive"
    (root / "candidates" / "i01-incoming").mkdir(parents=True)
    (root / "candidates" / "i01-incoming" / "traces.jsonl").write_text(EVIL_LINE + "\n" + "aaa\n")
    return root


def ws(archive: Path) -> Workspace:
    return Workspace(archive, archive.parent / "scratch", max_candidates=2)


@pytest.mark.timeout(20)
def test_catastrophic_backtracking_pattern_returns(archive: Path):
    # the old grep (Python's re) never returns from this; with the bounded one it is an ordinary search
    assert re.compile(r"(a+)+$")  # valid for a backtracking engine, so it used to be accepted and run
    out = ws(archive).call("grep", {"pattern": r"(a+)+$"})
    assert out == "candidates/i01-incoming/traces.jsonl:2: aaa"
    out = ws(archive).call("grep", {"pattern": r"(a|aa)*b", "path": "candidates"})
    assert out == "(no matches)"


@pytest.mark.timeout(20)
def test_grep_past_its_wall_budget_is_a_clear_error(archive: Path, monkeypatch: pytest.MonkeyPatch):
    from whale.metaharness.proposer import workspace

    monkeypatch.setattr(workspace, "GREP_TIMEOUT_S", 0.0)  # every budget is spent before the first line
    out = ws(archive).call("grep", {"pattern": "a"})
    assert out == (
        "error: grep ran out of its 0 s budget in candidates/i01-incoming/traces.jsonl after 0 matches; "
        "grep one file or use a simpler pattern"
    )


@pytest.mark.timeout(20)
def test_bad_and_oversized_patterns_are_clear_errors(archive: Path):
    w = ws(archive)
    assert w.call("grep", {"pattern": "("}).startswith("error: bad pattern '(': missing )")
    assert "no backreferences or lookaround" in w.call("grep", {"pattern": r"(a)\1"})
    assert "no backreferences or lookaround" in w.call("grep", {"pattern": r"(?=a)a"})
    too_long = "a" * (GREP_MAX_PATTERN_CHARS + 1)
    assert w.call("grep", {"pattern": too_long}) == (
        f"error: pattern is {GREP_MAX_PATTERN_CHARS + 1} characters; at most {GREP_MAX_PATTERN_CHARS}"
    )
    # a pattern whose compiled program would be huge is refused by RE2's memory cap, not built
    assert w.call("grep", {"pattern": r"\p{L}{1000}"}).startswith("error: bad pattern")
    assert w.call("grep", {"pattern": "x", "path": "nope"}) == "error: 'nope' does not exist"


@pytest.mark.timeout(60)
def test_grep_scans_a_bounded_number_of_bytes_and_skips_binary(archive: Path):
    big = archive / "big"
    big.mkdir()
    line = ("x" * 1023 + "\n").encode()
    (big / "a.txt").write_bytes(line * (GREP_MAX_BYTES // len(line) + 1024))  # > the whole budget
    (big / "b.txt").write_text("needle\n")
    (archive / "blob.bin").write_bytes(b"\0needle\n")
    out = ws(archive).call("grep", {"pattern": "needle", "path": "big"})
    assert out == f"(no matches)\n[stopped after scanning {GREP_MAX_BYTES} bytes; grep a subdirectory or one file]"
    assert ws(archive).call("grep", {"pattern": "needle", "path": "big/b.txt"}) == "big/b.txt:1: needle"
    assert ws(archive).call("grep", {"pattern": "needle", "path": "blob.bin"}) == "(no matches)"
    many = archive / "many.txt"
    many.write_text("hit " + "y" * 1000 + "\n" * 1 + ("hit\n" * (GREP_LIMIT * 3)))
    out = ws(archive).call("grep", {"pattern": "hit", "path": "many.txt"})
    assert out.endswith(f"[stopped at {GREP_LIMIT} matches]") and out.count("\n") == GREP_LIMIT
    assert max(len(x) for x in out.splitlines()) < 400  # each match line is cut


@pytest.mark.timeout(60)
def test_read_file_of_huge_binary_and_non_utf8_files(archive: Path):
    huge = archive / "huge.jsonl"
    with huge.open("wb") as fh:  # 200 MB, sparse: reading it whole is what must not happen
        fh.truncate(200 * 1024 * 1024)
        fh.seek(0)
        fh.write(b'{"a": 1}\n' * 10_000)
    w = ws(archive)
    out = w.call("read_file", {"path": "huge.jsonl"})
    assert out.startswith('{"a": 1}\n') and len(out) < READ_LIMIT_CHARS + 200
    assert f"({200 * 1024 * 1024} bytes in all); read again with offset={READ_LIMIT_CHARS}]" in out
    far = w.call("read_file", {"path": "huge.jsonl", "offset": READ_MAX_OFFSET_CHARS - 5})
    assert far.startswith("\0" * 5) and len(far) < READ_LIMIT_CHARS + 200  # skipped by reading, not loaded
    (archive / "blob.bin").write_bytes(b"\x7fELF\0\0" + b"x" * 100)
    assert w.call("read_file", {"path": "blob.bin"}) == (
        "error: 'blob.bin' is a binary file (106 bytes); only text files can be read"
    )
    text = archive / "text.txt"
    text.write_bytes(b"ok \xff\xfe caf\xc3\xa9\n" + b"z" * (3 * READ_LIMIT_CHARS))
    out = w.call("read_file", {"path": "text.txt"})
    assert out.startswith("ok \ufffd\ufffd café\n") and f"read again with offset={READ_LIMIT_CHARS}" in out
    assert len(out) < READ_LIMIT_CHARS + 200
    out = w.call("read_file", {"path": "text.txt", "offset": 2 * READ_LIMIT_CHARS})
    assert set(out.split("\n")[0]) == {"z"} and f"offset={3 * READ_LIMIT_CHARS}" in out
    assert w.call("read_file", {"path": "text.txt", "offset": 10 * READ_LIMIT_CHARS}) == ""
    assert "past the" in w.call("read_file", {"path": "text.txt", "offset": READ_MAX_OFFSET_CHARS + 1})
    assert w.call("read_file", {"path": "text.txt", "offset": "1" * 5000}).startswith("error:")


@pytest.mark.timeout(60)
def test_list_files_of_a_huge_tree_is_bounded(archive: Path, tmp_path: Path):
    tree = archive / "tree"
    for d in range(LIST_SCAN_LIMIT // 100 + 20):
        sub = tree / f"d{d:04d}"
        sub.mkdir(parents=True)
        for f in range(100):
            (sub / f"f{f:03d}").touch()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret")
    (archive / "link").symlink_to(outside, target_is_directory=True)
    w = ws(archive)
    out = w.call("list_files", {"path": "tree"})
    lines = out.splitlines()
    assert lines[-1] == f"[listing stopped after {LIST_SCAN_LIMIT} entries; list a subdirectory]"
    assert len([x for x in lines if x.startswith("tree/")]) == LIST_LIMIT
    assert w.call("list_files", {"path": "tree/d0003"}).count("\n") == 99
    # symlinks are not followed by a walk; through the link the read is refused
    root_listing = w.call("list_files", {"path": ""})
    assert "secret.txt" not in root_listing
    assert "s3cret" not in w.call("grep", {"pattern": "s3cret"})
    assert "outside the archive" in w.call("read_file", {"path": "link/secret.txt"})


def test_write_candidate_bounds_names_code_and_rationale(archive: Path):
    w = ws(archive)
    out = json.loads(
        w.call("write_candidate", {"name": "n" * 1_000_000, "code": "x = 1\n", "rationale": "é" * MAX_RATIONALE_BYTES})
    )
    assert out["written"] == f"candidates/{'n' * 60}.py"
    written = archive.parent / "scratch" / "candidates" / f"{'n' * 60}.md"
    assert len(written.read_bytes()) <= MAX_RATIONALE_BYTES
    assert "larger than" in w.call("write_candidate", {"name": "big", "code": "#" * 10_000_000})
