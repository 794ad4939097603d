"""The file tools the built-in agent uses: list / read / grep over the archive, write a candidate.

Paths are relative to the archive root; anything resolving outside it (``..``, absolute paths,
symlinks out) is refused. Reads and grep results are bounded so one tool call cannot flood the
agent's context. Writes go only to ``<scratch>/candidates/<name>.py`` with a sanitised name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from whale.metaharness.proposer.base import CANDIDATES_DIR, MAX_CANDIDATE_BYTES, MAX_RATIONALE_BYTES

READ_LIMIT_CHARS = 20_000
LIST_LIMIT = 500
GREP_LIMIT = 100
_NAME_RE = re.compile(r"[^A-Za-z0-9_-]+")

TOOL_SPECS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List files under a directory of the archive (recursive). '' = the archive root.",
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
            "description": "Search archive files for a regular expression; returns path:line: text matches.",
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
        except (ToolError, OSError, ValueError, re.error) as exc:
            return f"error: {exc}"

    def list_files(self, rel: str) -> str:
        root = self._resolve(rel)
        if not root.exists():
            raise ToolError(f"{rel!r} does not exist")
        if root.is_file():
            return root.relative_to(self.archive_dir).as_posix()
        files = sorted(p.relative_to(self.archive_dir).as_posix() for p in root.rglob("*") if p.is_file())
        more = f"\n... {len(files) - LIST_LIMIT} more" if len(files) > LIST_LIMIT else ""
        return "\n".join(files[:LIST_LIMIT]) + more or "(empty)"

    def read_file(self, rel: str, offset: int = 0) -> str:
        path = self._resolve(rel)
        if not path.is_file():
            raise ToolError(f"{rel!r} is not a file")
        text = path.read_bytes().decode("utf-8", errors="replace")
        chunk = text[max(offset, 0) : max(offset, 0) + READ_LIMIT_CHARS]
        if offset + READ_LIMIT_CHARS < len(text):
            chunk += f"\n[... {len(text) - offset - READ_LIMIT_CHARS} more characters; read again with offset={offset + READ_LIMIT_CHARS}]"
        return chunk

    def grep(self, pattern: str, rel: str = "") -> str:
        regex = re.compile(pattern)
        root = self._resolve(rel)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        hits: list[str] = []
        for path in files:
            text = path.read_bytes().decode("utf-8", errors="replace")
            for lineno, line in enumerate(text.splitlines(), start=1):
                if regex.search(line):
                    hits.append(f"{path.relative_to(self.archive_dir).as_posix()}:{lineno}: {line[:300]}")
                    if len(hits) >= GREP_LIMIT:
                        return "\n".join(hits) + f"\n[stopped at {GREP_LIMIT} matches]"
        return "\n".join(hits) or "(no matches)"

    def write_candidate(self, name: str, code: str, rationale: str = "") -> str:
        safe = _NAME_RE.sub("_", name).strip("_")[:60] or f"candidate{len(self.written) + 1}"
        if safe not in self.written and len(self.written) >= self.max_candidates:
            raise ToolError(f"already wrote {self.max_candidates} candidates ({', '.join(self.written)}); call finish")
        if len(code.encode("utf-8")) > MAX_CANDIDATE_BYTES:
            raise ToolError(f"candidate is larger than {MAX_CANDIDATE_BYTES} bytes")
        out = self.scratch_dir / CANDIDATES_DIR
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{safe}.py").write_text(code, encoding="utf-8")
        (out / f"{safe}.md").write_text(rationale[:MAX_RATIONALE_BYTES], encoding="utf-8")
        if safe not in self.written:
            self.written.append(safe)
        return json.dumps({"written": f"{CANDIDATES_DIR}/{safe}.py", "candidates": self.written})
