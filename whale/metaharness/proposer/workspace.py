"""The file tools the built-in agent uses: list / read / grep over the archive, write a candidate.

Paths are relative to the archive root; anything resolving outside it (``..``, absolute paths,
symlinks out) is refused, and symlinks are never followed by a listing or a grep. Every tool call does
bounded work, because the agent is untrusted and its tool calls run inside the proposer's event loop
(a call that hung would hang the whole phase past its timeout):

* ``list_files`` walks at most ``LIST_SCAN_LIMIT`` entries and returns at most ``LIST_LIMIT`` paths;
* ``read_file`` returns at most ``READ_LIMIT_CHARS`` characters, reads the file incrementally (never
  whole), refuses offsets past ``READ_MAX_OFFSET_CHARS`` and binary files (a NUL byte in the first
  ``BINARY_SNIFF_BYTES``), and decodes non-UTF-8 bytes as U+FFFD;
* ``grep`` compiles the agent's pattern with RE2 (``google-re2``: linear-time matching, no
  backtracking, compile memory capped at ``GREP_MAX_MEM``; so ``(a+)+$`` cannot hang), refuses patterns
  longer than ``GREP_MAX_PATTERN_CHARS``, scans at most ``GREP_MAX_BYTES`` in all and
  ``GREP_MAX_LINE_CHARS`` of a line, stops at ``GREP_LIMIT`` matches and at ``GREP_TIMEOUT_S``, and
  skips binary files;
* ``write_candidate`` writes only ``<scratch>/candidates/<name>.py`` (+ ``.md``) with a sanitised name,
  at most ``MAX_CANDIDATE_BYTES`` of code and ``MAX_RATIONALE_BYTES`` of rationale.

A bad pattern, a timeout or a refused read comes back to the agent as ``error: ...`` text.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import re2

from whale.metaharness.proposer.base import CANDIDATES_DIR, MAX_CANDIDATE_BYTES, MAX_RATIONALE_BYTES

READ_LIMIT_CHARS = 20_000
#: read_file skips to ``offset`` by reading; past this it refuses (grep finds lines in a huge file)
READ_MAX_OFFSET_CHARS = 64_000_000
#: a NUL byte in the first this many bytes makes a file binary (git's rule)
BINARY_SNIFF_BYTES = 8192
LIST_LIMIT = 500
#: directory entries one list_files / grep walks at most
LIST_SCAN_LIMIT = 20_000
GREP_LIMIT = 100
GREP_MAX_PATTERN_CHARS = 1000
#: bytes one grep call reads at most, over all files
GREP_MAX_BYTES = 32 * 1024 * 1024
#: characters of one line a grep searches (a trace line holds a whole episode)
GREP_MAX_LINE_CHARS = 1_000_000
#: wall-clock budget of one grep call
GREP_TIMEOUT_S = 5.0
#: RE2's memory budget for the compiled pattern (a pattern that needs more is refused)
GREP_MAX_MEM = 8 * 1024 * 1024
_MATCH_SHOWN_CHARS = 300
_NAME_RE = re.compile(r"[^A-Za-z0-9_-]+")

TOOL_SPECS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": f"List files under a directory of the archive (recursive, at most {LIST_LIMIT}). "
            "'' = the archive root.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": f"Read a text file of the archive; at most {READ_LIMIT_CHARS} characters from `offset`.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": f"Search archive files for a regular expression (RE2 syntax: no backreferences or "
            f"lookaround); returns path:line: text matches, at most {GREP_LIMIT}.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_candidate",
            "description": "Write one complete harness candidate file, with a short rationale (one mechanism).",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "short file name, letters/digits/_/-"},
                    "code": {"type": "string", "description": "the whole Python file"},
                    "rationale": {"type": "string", "description": "what changes and why, 1-5 sentences"},
                },
                "required": ["name", "code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "End this iteration once your candidates are written.",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": []},
        },
    },
]


class ToolError(ValueError):
    """A tool call the agent got wrong; the message goes back to the agent."""


class Workspace:
    """The agent's view: the archive copy (read-only) and the scratch directory (candidates only)."""

    def __init__(self, archive_dir: Path, scratch_dir: Path, max_candidates: int):
        self.archive_dir = Path(archive_dir).resolve()
        self.scratch_dir = Path(scratch_dir).resolve()
        self.max_candidates = max_candidates
        self.written: list[str] = []
        self.finished = False

    def _resolve(self, rel: str) -> Path:
        rel = (rel or "").strip().lstrip("/")  # archive-root-relative, also when written as "/x"
        path = (self.archive_dir / rel).resolve()
        if path != self.archive_dir and self.archive_dir not in path.parents:
            raise ToolError(f"{rel!r} is outside the archive; use paths relative to the archive root")
        return path

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call; errors come back as text for the agent."""
        try:
            if name == "list_files":
                return self.list_files(str(arguments.get("path", "")))
            if name == "read_file":
                return self.read_file(str(arguments["path"]), int(arguments.get("offset", 0) or 0))
            if name == "grep":
                return self.grep(str(arguments["pattern"]), str(arguments.get("path", "")))
            if name == "write_candidate":
                return self.write_candidate(
                    str(arguments["name"]), str(arguments["code"]), str(arguments.get("rationale", ""))
                )
            if name == "finish":
                self.finished = True
                return "ok"
            raise ToolError(f"unknown tool {name!r}; use one of {[t['function']['name'] for t in TOOL_SPECS]}")
        except KeyError as exc:
            return f"error: missing argument {exc}"
        except (ToolError, OSError, ValueError) as exc:
            return f"error: {exc}"

    def _walk(self, root: Path) -> tuple[list[Path], bool]:
        """Regular files under ``root`` (symlinks skipped, not followed), sorted; at most
        ``LIST_SCAN_LIMIT`` directory entries looked at. Returns (files, truncated)."""
        files: list[Path] = []
        for seen, (entry, is_file) in enumerate(_scan(root), start=1):
            if seen > LIST_SCAN_LIMIT:
                return sorted(files), True
            if is_file:
                files.append(entry)
        return sorted(files), False

    def list_files(self, rel: str) -> str:
        root = self._resolve(rel)
        if not root.exists():
            raise ToolError(f"{rel!r} does not exist")
        if root.is_file():
            return root.relative_to(self.archive_dir).as_posix()
        files, truncated = self._walk(root)
        names = [p.relative_to(self.archive_dir).as_posix() for p in files[:LIST_LIMIT]]
        more = ""
        if len(files) > LIST_LIMIT:
            more = f"\n... {len(files) - LIST_LIMIT} more"
        if truncated:
            more += f"\n[listing stopped after {LIST_SCAN_LIMIT} entries; list a subdirectory]"
        return "\n".join(names) + more or "(empty)"

    def read_file(self, rel: str, offset: int = 0) -> str:
        path = self._resolve(rel)
        if not path.is_file():
            raise ToolError(f"{rel!r} is not a file")
        offset = max(offset, 0)
        if offset > READ_MAX_OFFSET_CHARS:
            raise ToolError(
                f"offset {offset} is past the {READ_MAX_OFFSET_CHARS} characters read_file can skip; "
                "use grep to find lines in a file this large"
            )
        size = path.stat().st_size
        with path.open("rb") as raw:
            if b"\0" in raw.read(BINARY_SNIFF_BYTES):
                raise ToolError(f"{rel!r} is a binary file ({size} bytes); only text files can be read")
        with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
            skip = offset
            while skip > 0:
                got = len(fh.read(min(skip, 1 << 20)))
                if got == 0:
                    break
                skip -= got
            chunk = fh.read(READ_LIMIT_CHARS)
            more = bool(fh.read(1))
        if more:
            chunk += (
                f"\n[... more characters ({size} bytes in all); read again with offset={offset + READ_LIMIT_CHARS}]"
            )
        return chunk

    def grep(self, pattern: str, rel: str = "") -> str:
        regex = _compile(pattern)
        root = self._resolve(rel)
        if not root.exists():
            raise ToolError(f"{rel!r} does not exist")
        files, truncated = ([root], False) if root.is_file() else self._walk(root)
        deadline = time.monotonic() + GREP_TIMEOUT_S
        budget = GREP_MAX_BYTES
        hits: list[str] = []
        stopped = f"\n[stopped after walking {LIST_SCAN_LIMIT} entries; grep a subdirectory]" if truncated else ""
        for path in files:
            if budget <= 0:
                stopped = f"\n[stopped after scanning {GREP_MAX_BYTES} bytes; grep a subdirectory or one file]"
                break
            with path.open("rb") as fh:
                data = fh.read(budget)
            budget -= len(data)
            if b"\0" in data[:BINARY_SNIFF_BYTES]:
                continue
            name = path.relative_to(self.archive_dir).as_posix()
            for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
                if time.monotonic() >= deadline:
                    raise ToolError(
                        f"grep ran out of its {GREP_TIMEOUT_S:g} s budget in {name} after "
                        f"{len(hits)} matches; grep one file or use a simpler pattern"
                    )
                if regex.search(line[:GREP_MAX_LINE_CHARS]):
                    hits.append(f"{name}:{lineno}: {line[:_MATCH_SHOWN_CHARS]}")
                    if len(hits) >= GREP_LIMIT:
                        return "\n".join(hits) + f"\n[stopped at {GREP_LIMIT} matches]"
        return ("\n".join(hits) or "(no matches)") + stopped

    def write_candidate(self, name: str, code: str, rationale: str = "") -> str:
        safe = safe_name(name) or f"candidate{len(self.written) + 1}"
        if safe not in self.written and len(self.written) >= self.max_candidates:
            raise ToolError(f"already wrote {self.max_candidates} candidates ({', '.join(self.written)}); call finish")
        if len(code.encode("utf-8")) > MAX_CANDIDATE_BYTES:
            raise ToolError(f"candidate is larger than {MAX_CANDIDATE_BYTES} bytes")
        out = self.scratch_dir / CANDIDATES_DIR
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{safe}.py").write_text(code, encoding="utf-8")
        rationale_bytes = rationale.encode("utf-8")[:MAX_RATIONALE_BYTES]
        (out / f"{safe}.md").write_text(rationale_bytes.decode("utf-8", errors="ignore"), encoding="utf-8")
        if safe not in self.written:
            self.written.append(safe)
        return json.dumps({"written": f"{CANDIDATES_DIR}/{safe}.py", "candidates": self.written})


def safe_name(name: str) -> str:
    """A candidate name as a file stem: letters, digits, ``_`` and ``-`` only, at most 60 characters."""
    return _NAME_RE.sub("_", name[:200]).strip("_")[:60]


def _scan(root: Path) -> Iterator[tuple[Path, bool]]:
    """Every entry under ``root`` as (path, is a regular file), depth first, never through a symlink."""
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if is_dir:
                        stack.append(Path(entry.path))
                    yield Path(entry.path), not is_dir and entry.is_file(follow_symlinks=False)
        except OSError:
            continue


def _compile(pattern: str) -> Any:
    """The agent's pattern as an RE2 regex, or a ToolError that says what is wrong."""
    if len(pattern) > GREP_MAX_PATTERN_CHARS:
        raise ToolError(f"pattern is {len(pattern)} characters; at most {GREP_MAX_PATTERN_CHARS}")
    options = re2.Options()
    options.log_errors = False
    options.max_mem = GREP_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ToolError(
            f"bad pattern {pattern[:80]!r}: {detail} (RE2 syntax: no backreferences or lookaround)"
        ) from None
