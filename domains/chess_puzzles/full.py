"""The paper's chess data (``spec.experiment.data.source: full``): the Lichess puzzle database, split 16,384 / 256 / 256.

As the reference (``krafton-ai/WHALE`` ``prepare_chess_puzzle_data.py``): the database is streamed, puzzles
whose line has 1 to 9 solver plies are eligible, and a seeded draw (the paper's seed is 42) gives
**D_test** (``testSize``, 256), **D_harness** (``harnessSize``, 256) and **D_weight** (``weightSize``, else
16,384 = 64 steps of 256 prompts per epoch), disjoint by position and side to move.

How the draw works, in bounded memory over the ~5 M rows of the ``.csv.zst`` file:

1. one streaming pass keeps the eligible rows with the smallest ``sha256(f"{seed}:{PuzzleId}")`` (a
   seeded, order-independent shuffle), twice as many as the splits need;
2. those rows, in that order, are validated exactly as the sample's (``chess_puzzles.puzzle.parse_puzzle``:
   a possible FEN, every move legal); a bad row or a repeated position is skipped and counted in the
   manifest (the database is upstream's; a split never shrinks, the next puzzle takes the place);
3. the first valid ones fill D_test, then D_harness, then D_weight. Too few (a tiny file) fails naming the sizes.

The file changes every month: its SHA-256 is recorded in the store's sources manifest at the first fetch and
checked on every re-use; pin a month's file in ``spec.experiment.data.sources`` (``sha256``, and ``url`` for a mirror).
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import io
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chess_puzzles.puzzle import (
    LICHESS_COLUMNS,
    MAX_SOLVER_PLIES,
    MIN_SOLVER_PLIES,
    REQUIRED_COLUMNS,
    PuzzleError,
    parse_puzzle,
    raw_row,
)
from whale.domain import FullData, FullDataError, Source

if TYPE_CHECKING:
    from whale.domain import Data

LICHESS = Source(
    name="lichess-puzzles",
    url="https://database.lichess.org/lichess_db_puzzle.csv.zst",
    filename="lichess_db_puzzle.csv.zst",
    max_bytes=2 << 30,
    description="the Lichess puzzle database (CC0), a zstd CSV re-published monthly",
)
PAPER_WEIGHT = 16_384
DEFAULT_TEST = 256
#: candidates kept per needed puzzle in the streaming pass (room for bad rows and repeated positions)
OVERSAMPLE = 2
#: bad rows quoted in the manifest (all are counted)
MAX_REPORTED = 20
#: rows read at most: the database has ~5 M; a file that decompresses to far more is refused
MAX_ROWS = 50_000_000
VERSION = 1


def sizes(data: Data) -> dict[str, int]:
    weight = PAPER_WEIGHT if data.weight_size is None else data.weight_size
    test = DEFAULT_TEST if data.test_size is None else data.test_size
    return {"weight": weight, "harness": data.harness_size, "test": test}


def draw_key(seed: int, puzzle_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{puzzle_id}".encode()).digest()[:8], "big")


def eligible(row: Mapping[str, Any]) -> bool:
    """Cheap pre-filter before validation: a line of MIN..MAX solver plies."""
    plies = len(str(row.get("Moves") or "").split()) // 2
    return MIN_SOLVER_PLIES <= plies <= MAX_SOLVER_PLIES


def candidates(rows: Iterator[Mapping[str, Any]], seed: int, keep: int) -> tuple[list[dict[str, str]], Counter[str]]:
    """The ``keep`` eligible rows with the smallest draw keys, in key order; and row counts."""
    heap: list[tuple[int, str, dict[str, str]]] = []  # max-heap on the key via negation
    counts: Counter[str] = Counter()
    for row in rows:
        counts["rows"] += 1
        if not eligible(row):
            counts["ineligiblePlies"] += 1
            continue
        pid = str(row.get("PuzzleId") or "")
        entry = (-draw_key(seed, pid), pid, raw_row(row))
        if len(heap) < keep:
            heapq.heappush(heap, entry)
        elif entry > heap[0]:
            heapq.heapreplace(heap, entry)
    ordered = sorted(heap, key=lambda e: (-e[0], e[1]))
    return [row for _, _, row in ordered], counts


def select(rows: list[dict[str, str]], need: dict[str, int]) -> tuple[dict[str, list[dict[str, str]]], dict[str, Any]]:
    """Validate in order and fill test, harness, weight; skip bad rows and repeated positions."""
    out: dict[str, list[dict[str, str]]] = {"test": [], "harness": [], "weight": []}
    order = [name for name in ("test", "harness", "weight") if need[name] > 0]
    seen: set[str] = set()
    bad: list[str] = []
    repeats = 0
    for row in rows:
        if not order:
            break
        try:
            puzzle = parse_puzzle(row)
        except PuzzleError as exc:
            bad.append(f"{row.get('PuzzleId')}: {exc.reason}")
            continue
        if puzzle.key in seen:
            repeats += 1
            continue
        seen.add(puzzle.key)
        out[order[0]].append(row)
        if len(out[order[0]]) == need[order[0]]:
            order.pop(0)
    stats = {"badRows": len(bad), "badRowsShown": bad[:MAX_REPORTED], "repeatedPositions": repeats}
    return {"weight": out["weight"], "harness": out["harness"], "test": out["test"]}, stats


def read_zst_csv(path: Path, max_rows: int = MAX_ROWS) -> Iterator[dict[str, str]]:
    """The rows of a zstd-compressed Lichess CSV, streamed; a broken file, an over-long field or more than
    ``max_rows`` rows (a decompression bomb) is a FullDataError naming the file and the line."""
    import zstandard

    with Path(path).open("rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        text = io.TextIOWrapper(reader, encoding="utf-8-sig", newline="")
        rows = csv.DictReader(text)
        try:
            missing = [c for c in REQUIRED_COLUMNS if c not in (rows.fieldnames or [])]
            if missing:
                raise FullDataError(
                    f"{path}: header lacks {', '.join(missing)}; expected the Lichess columns "
                    f"{','.join(LICHESS_COLUMNS)}"
                )
            for n, row in enumerate(rows, 1):
                if n > max_rows:
                    raise FullDataError(
                        f"{path}: more than {max_rows:,} rows; the Lichess database has ~5 M; is it the right file?"
                    )
                yield row
        except (zstandard.ZstdError, csv.Error, UnicodeDecodeError) as exc:
            raise FullDataError(
                f"{path}: not a readable zstd-compressed Lichess CSV near line {rows.line_num} "
                f"({type(exc).__name__}: {exc})"
            ) from None


def build(paths: Mapping[str, Path], data: Data) -> tuple[dict[str, list[dict[str, str]]], dict[str, Any]]:
    need = sizes(data)
    total = sum(need.values())
    keep = max(total * OVERSAMPLE, total + 64)
    while True:
        rows, counts = candidates(read_zst_csv(paths[LICHESS.name]), data.seed, keep)
        splits, stats = select(rows, need)
        if all(len(splits[name]) == need[name] for name in need):
            break
        eligible_rows = counts["rows"] - counts["ineligiblePlies"]
        if keep >= eligible_rows:
            got = {name: len(rows_) for name, rows_ in splits.items()}
            raise FullDataError(
                f"the Lichess file has too few usable puzzles ({eligible_rows} eligible rows) for {need}; got {got}: "
                "lower spec.experiment.data.weightSize / harnessSize / testSize or fetch the full database"
            )
        keep *= 4  # many bad rows or repeats among the draw: draw more (a further pass)
    return splits, {**dict(counts), **stats, "candidates": len(rows)}


FULL = FullData(
    domain="chess_puzzles",
    sources=(LICHESS,),
    version=VERSION,
    sizes=sizes,
    build=build,
)
