"""Data preparation: the Lichess CSV -> D_weight / D_harness / D_test, materialised once with a manifest.

Choices (docs/data.md says the same):

* identity of a puzzle = the position the solver first sees (after ``Moves[0]``): board + side to move.
  Puzzles sharing it are duplicates; the lowest PuzzleId is kept. Splits are therefore disjoint by position.
* only lines of 1-9 solver plies enter a split; others are dropped and counted in the manifest.
* a bad row (malformed CSV row, impossible FEN, illegal move in the line, duplicate PuzzleId) **fails** the
  preparation with one error listing every bad row by line and PuzzleId: a split never silently shrinks,
  and nothing can go wrong later in an episode.
* order: valid puzzles sorted by PuzzleId, shuffled with ``random.Random(seed)``; the first ``testSize``
  (default 256, the paper's size) are D_test, the next ``harnessSize`` (256) D_harness, the rest D_weight
  (capped at ``weightSize``). Caps on D_weight never move an item between test and harness.

Splits live in the store under ``data/chess_puzzles/<tag>/`` (``whale.domain.data_prefix``), where the tag
hashes the source file and the split settings; ``manifest.json`` is written last and holds counts and
SHA-256 hashes. A later call re-uses the files when the manifest matches and the hashes check out.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chess_puzzles.puzzle import (
    LICHESS_COLUMNS,
    MAX_SOLVER_PLIES,
    MIN_SOLVER_PLIES,
    REQUIRED_COLUMNS,
    Puzzle,
    PuzzleError,
    parse_puzzle,
    raw_row,
)
from whale.domain import SPLITS, data_prefix, data_root

if TYPE_CHECKING:
    from whale.domain import Data, Store

DOMAIN = "chess_puzzles"
SOURCE_FILE = "lichess_puzzles_sample.csv"
#: bump when the preparation logic changes, so stale materialised splits are not re-used
PREP_VERSION = 1
#: D_test when spec.experiment.data.testSize is unset: the paper's 256
DEFAULT_TEST_SIZE = 256
#: bad rows quoted in the error message (all are counted)
MAX_REPORTED = 20


class ChessDataError(ValueError):
    """The raw data cannot be prepared: a missing file, too few puzzles, or bad rows (listed)."""


@dataclass(frozen=True)
class BadRow:
    line: int
    puzzle_id: str
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}, puzzle {self.puzzle_id}: {self.reason}"


class BadRowsError(ChessDataError):
    def __init__(self, path: Path | str, bad: Sequence[BadRow]):
        self.path, self.bad = str(path), list(bad)
        shown = "\n  ".join(str(b) for b in self.bad[:MAX_REPORTED])
        more = f"\n  ... and {len(self.bad) - MAX_REPORTED} more" if len(self.bad) > MAX_REPORTED else ""
        super().__init__(
            f"{len(self.bad)} bad row(s) in {path}:\n  {shown}{more}\n"
            "Fix or delete these rows (preparation refuses partial data so splits never silently shrink)."
        )


@dataclass(frozen=True)
class Item:
    """A validated puzzle with the raw row it came from (the raw row is what splits store)."""

    puzzle: Puzzle
    row: dict[str, str]


@dataclass(frozen=True)
class Sizes:
    seed: int
    harness: int
    test: int
    weight_cap: int | None

    @classmethod
    def from_data(cls, data: Data) -> Sizes:
        return cls(
            seed=data.seed,
            harness=data.harness_size,
            test=data.test_size if data.test_size is not None else DEFAULT_TEST_SIZE,
            weight_cap=data.weight_size,
        )

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "harnessSize": self.harness, "testSize": self.test, "weightSize": self.weight_cap}


@dataclass(frozen=True)
class Splits:
    items: dict[str, list[Item]]
    dropped: dict[str, int]


# ----- reading and validating (pure over text) ----------------------------------------------------


def source_path(data: Data) -> Path:
    path = data_root(data) / DOMAIN / SOURCE_FILE
    if not path.is_file():
        raise ChessDataError(
            f"chess puzzle data not found: {path} does not exist. Put the Lichess CSV there, point "
            f"spec.experiment.data.dataDir (or $WHALE_DATA_DIR) at a folder holding chess_puzzles/{SOURCE_FILE}, or unset "
            "both for the sample shipped with whale (whale/data/sample/README.md)"
        )
    return path


def parse_csv(text: str, where: str = "<csv>") -> list[Item]:
    """Every row validated; any bad row -> BadRowsError listing all of them."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ChessDataError(
            f"{where}: header lacks column(s) {', '.join(missing)}; expected the Lichess columns "
            f"{','.join(LICHESS_COLUMNS)}"
        )
    items: list[Item] = []
    bad: list[BadRow] = []
    seen: dict[str, int] = {}
    line = reader.line_num
    for row in reader:
        line_start, line = line + 1, reader.line_num
        puzzle_id = (row.get("PuzzleId") or "").strip() or "(no PuzzleId)"
        if None in row:
            bad.append(
                BadRow(line_start, puzzle_id, f"{len(header) + len(row[None])} fields, the header has {len(header)}")
            )
            continue
        if any(value is None for value in row.values()):
            n = sum(value is not None for value in row.values())
            bad.append(BadRow(line_start, puzzle_id, f"{n} fields, the header has {len(header)}"))
            continue
        if puzzle_id in seen:
            bad.append(BadRow(line_start, puzzle_id, f"duplicate PuzzleId (first on line {seen[puzzle_id]})"))
            continue
        seen[puzzle_id] = line_start
        try:
            items.append(Item(parse_puzzle(row), raw_row(row)))
        except PuzzleError as exc:
            bad.append(BadRow(line_start, puzzle_id, exc.reason))
    if bad:
        raise BadRowsError(where, bad)
    return items


def make_splits(items: Iterable[Item], sizes: Sizes) -> Splits:
    """Filter, de-duplicate by position and split. Pure and deterministic in (items, sizes)."""
    by_key: dict[str, Item] = {}
    dropped: Counter[str] = Counter()
    for item in sorted(items, key=lambda it: it.puzzle.puzzle_id):
        if not MIN_SOLVER_PLIES <= item.puzzle.solver_plies <= MAX_SOLVER_PLIES:
            dropped["solver_plies_out_of_range"] += 1
        elif item.puzzle.key in by_key:
            dropped["duplicate_position"] += 1
        else:
            by_key[item.puzzle.key] = item
    pool = list(by_key.values())
    need = sizes.test + sizes.harness + 1
    if len(pool) < need:
        raise ChessDataError(
            f"only {len(pool)} usable chess puzzles; D_test ({sizes.test}) + D_harness ({sizes.harness}) + at least "
            "1 for D_weight do not fit: lower spec.experiment.data.testSize / harnessSize or add puzzles"
        )
    random.Random(sizes.seed).shuffle(pool)
    test, harness, weight = pool[: sizes.test], pool[sizes.test : need - 1], pool[need - 1 :]
    if sizes.weight_cap is not None:
        weight = weight[: sizes.weight_cap]
    return Splits({"weight": weight, "harness": harness, "test": test}, dict(dropped))


def split_bytes(items: Sequence[Item]) -> bytes:
    return "".join(json.dumps(it.row, sort_keys=True) + "\n" for it in items).encode("utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----- the manifest and materialisation (I/O) ---------------------------------------------------------


def config_of(source_sha: str, sizes: Sizes) -> dict[str, Any]:
    return {"domain": DOMAIN, "prepVersion": PREP_VERSION, "sourceSha256": source_sha, **sizes.to_json()}


def tag_of(config: dict[str, Any]) -> str:
    return sha256(json.dumps(config, sort_keys=True).encode())[:16]


def split_prefix(config: dict[str, Any]) -> str:
    return f"{data_prefix(DOMAIN)}/{tag_of(config)}"


def build_manifest(config: dict[str, Any], source: Path, rows: int, splits: Splits) -> dict[str, Any]:
    return {
        "config": config,
        "source": {"file": source.name, "rows": rows},
        "dropped": splits.dropped,
        "splits": {
            name: {
                "count": len(items),
                "sha256": sha256(split_bytes(items)),
                "key": f"{name}.jsonl",
                "solverPlies": dict(sorted(Counter(str(it.puzzle.solver_plies) for it in items).items())),
            }
            for name, items in splits.items.items()
        },
    }


@functools.lru_cache(maxsize=4)
def _read_cached(path: str, mtime_ns: int, size: int) -> tuple[str, tuple[Item, ...]]:
    raw = Path(path).read_bytes()
    return sha256(raw), tuple(parse_csv(raw.decode("utf-8-sig"), where=path))


def prepare(data: Data) -> tuple[dict[str, Any], int, Splits]:
    """Read, validate (cached per file state) and split in memory. Returns (config, valid rows, splits)."""
    path = source_path(data)
    stat = path.stat()
    sizes = Sizes.from_data(data)
    source_sha, items = _read_cached(str(path), stat.st_mtime_ns, stat.st_size)
    return config_of(source_sha, sizes), len(items), make_splits(items, sizes)


def split_sizes(data: Data) -> dict[str, int]:
    """|D_weight|, |D_harness|, |D_test| (validates the file; about a second for the 3k-row sample, then cached)."""
    _, _, splits = prepare(data)
    return {name: len(splits.items[name]) for name in SPLITS}


def _manifest_ok(store: Store, prefix: str, manifest: dict[str, Any] | None, config: dict[str, Any]) -> bool:
    if not manifest or manifest.get("config") != config:
        return False
    for name in SPLITS:
        entry = manifest.get("splits", {}).get(name)
        key = f"{prefix}/{name}.jsonl"
        if not entry or not store.exists(key) or sha256(store.read_bytes(key)) != entry.get("sha256"):
            return False
    return True


def materialise(store: Store, data: Data) -> dict[str, Any]:
    """Write the splits and the manifest once; re-use them when the manifest matches. Returns the manifest."""
    config, rows, splits = prepare(data)
    prefix = split_prefix(config)
    manifest_key = f"{prefix}/manifest.json"
    existing = store.read_json_or_none(manifest_key)
    if existing is not None and _manifest_ok(store, prefix, existing, config):
        return existing
    for name in SPLITS:
        store.write_bytes(f"{prefix}/{name}.jsonl", split_bytes(splits.items[name]))
    manifest = build_manifest(config, source_path(data), rows, splits)
    store.write_json(manifest_key, manifest)  # last: its presence means the splits are complete
    return manifest


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")


def rows_in_memory(data: Data, split: str) -> list[dict[str, str]]:
    """The raw rows of one split without a store (same order and content as the materialised file)."""
    _check_split(split)
    _, _, splits = prepare(data)
    return [dict(item.row) for item in splits.items[split]]


def load_split(store: Store, data: Data, split: str) -> list[dict[str, str]]:
    """The raw rows of one split, materialising the splits in ``store`` first if needed."""
    _check_split(split)
    manifest = materialise(store, data)
    prefix = split_prefix(manifest["config"])
    return [json.loads(line) for line in store.read_text(f"{prefix}/{split}.jsonl").splitlines() if line.strip()]
