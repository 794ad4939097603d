"""`whale prepare` and the prepare workload with `spec.experiment.data.source: full`, against a real HTTP server on
loopback serving small stand-ins of the real files (a zstd Lichess CSV, a DAPO-shaped parquet, FlashRAG
JSON lines) with known SHA-256: fetch, verify, split into a real local store; refuse a corrupted file;
resume an interrupted download; do nothing on a re-run with everything present."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.files_server import _files_server, files_server  # noqa: F401 - fixtures
from whale import plugins
from whale.cli import app
from whale.core import layout
from whale.core.convert import convert_v1alpha1
from whale.core.spec import WhaleRunSpec
from whale.data import full
from whale.data.fetch import part_path
from whale.domain import default_data_root
from whale.store import open_store
from whale.workloads import prepare

SAMPLE_CSV = default_data_root() / "chess_puzzles" / "lichess_puzzles_sample.csv"


def zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(tmp_path: Path, domain: str, data: dict, name: str = "full-run") -> Path:
    doc = convert_v1alpha1(
        {
            "apiVersion": "whale.dev/v1alpha1",
            "kind": "WhaleRun",
            "metadata": {"name": name},
            "spec": {
                "domain": domain,
                "condition": "rsft_only",
                "model": {"name": "synthetic-tiny"},
                "schedule": {"totalSteps": 4},
                "data": {"source": "full", **data},
            },
        }
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def store_snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def lichess_zst() -> bytes:
    return zstd(SAMPLE_CSV.read_bytes())


def chess_data(files_server, blob: bytes, **pin) -> dict:
    files_server.files["/lichess_db_puzzle.csv.zst"] = blob
    return {
        "seed": 42,
        "weightSize": 100,
        "harnessSize": 20,
        "testSize": 20,
        "sources": [{"name": "lichess-puzzles", "url": files_server.url("lichess_db_puzzle.csv.zst"), **pin}],
    }


def run_prepare(path: Path, store: Path, cache: Path, *extra: str):
    return CliRunner().invoke(app, ["prepare", str(path), "--store", str(store), "--cache-dir", str(cache), *extra])


def test_whale_prepare_fetches_verifies_and_writes_the_papers_splits(files_server, tmp_path, lichess_zst):
    path = manifest(tmp_path, "chess_puzzles", chess_data(files_server, lichess_zst, sha256=sha(lichess_zst)))
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache", "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["sizes"] == {"weight": 100, "harness": 20, "test": 20}
    assert [(s["name"], s["action"], s["sha256"]) for s in out["sources"]] == [
        ("lichess-puzzles", "fetched", sha(lichess_zst))
    ]
    store = open_store(str(tmp_path / "st"))
    recorded = store.read_json(f"{layout.data_prefix('chess_puzzles')}/sources/manifest.json")["lichess-puzzles"]
    assert (recorded["sha256"], recorded["bytes"], recorded["pinned"]) == (sha(lichess_zst), len(lichess_zst), True)
    assert store.read_bytes(recorded["key"]) == lichess_zst  # the exact file the splits came from is kept
    # the workloads read the prepared splits from the store: disjoint by position, the sizes asked for
    spec = WhaleRunSpec.model_validate(yaml.safe_load(path.read_text())["spec"])
    domain = plugins.load("chess_puzzles")
    splits = {name: domain.load_split(name, spec.experiment.data, store) for name in ("weight", "harness", "test")}
    assert {k: len(v) for k, v in splits.items()} == out["sizes"]
    ids = [item["id"] for rows in splits.values() for item in rows]
    assert len(set(ids)) == len(ids)
    # the same settings give the same draw (seeded), and `whale plan` sees the paper-sized split sizes
    assert splits["test"] == domain.load_split("test", spec.experiment.data, store)


def test_a_re_run_with_everything_present_downloads_and_writes_nothing(files_server, tmp_path, lichess_zst):
    path = manifest(tmp_path, "chess_puzzles", chess_data(files_server, lichess_zst))
    assert run_prepare(path, tmp_path / "st", tmp_path / "cache").exit_code == 0
    requests, before = len(files_server.requests), store_snapshot(tmp_path / "st")
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache", "-o", "json")
    assert res.exit_code == 0, res.output
    assert [s["action"] for s in json.loads(res.output)["sources"]] == ["reused"]
    assert len(files_server.requests) == requests  # nothing downloaded
    assert store_snapshot(tmp_path / "st") == before  # nothing written


def test_a_fresh_cache_re_uses_the_stores_copy_after_checking_it(files_server, tmp_path, lichess_zst):
    """A second machine (or a new prepare pod) with an empty cache takes the file from the store."""
    path = manifest(tmp_path, "chess_puzzles", chess_data(files_server, lichess_zst))
    assert run_prepare(path, tmp_path / "st", tmp_path / "cache1").exit_code == 0
    requests = len(files_server.requests)
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache2", "-o", "json")
    assert res.exit_code == 0 and json.loads(res.output)["sources"][0]["action"] == "reused"
    assert len(files_server.requests) == requests


def test_a_corrupted_stored_copy_is_refused(files_server, tmp_path, lichess_zst):
    path = manifest(tmp_path, "chess_puzzles", chess_data(files_server, lichess_zst))
    assert run_prepare(path, tmp_path / "st", tmp_path / "cache1").exit_code == 0
    key = f"{layout.data_prefix('chess_puzzles')}/sources/lichess-puzzles/lichess_db_puzzle.csv.zst"
    (tmp_path / "st" / key).write_bytes(lichess_zst + b"tampered")
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache2")
    assert res.exit_code == 1
    text = " ".join(res.output.split())
    assert "stored copy" in text and sha(lichess_zst) in text and sha(lichess_zst + b"tampered") in text


def test_a_corrupted_download_is_refused_naming_the_url_and_both_digests(files_server, tmp_path, lichess_zst):
    bad = lichess_zst[:-10] + b"0123456789"
    data = chess_data(files_server, bad, sha256=sha(lichess_zst))
    path = manifest(tmp_path, "chess_puzzles", data)
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache")
    assert res.exit_code == 1
    text = "".join(res.output.split())  # rich may wrap the long line anywhere
    assert data["sources"][0]["url"] in text and sha(lichess_zst) in text and sha(bad) in text
    assert not (tmp_path / "st" / layout.data_prefix("chess_puzzles")).exists()  # nothing recorded or split
    assert not list((tmp_path / "cache").rglob("*.part"))


def test_an_interrupted_download_is_resumed_by_the_next_prepare(files_server, tmp_path, lichess_zst):
    path = manifest(tmp_path, "chess_puzzles", chess_data(files_server, lichess_zst, sha256=sha(lichess_zst)))
    files_server.cut("lichess_db_puzzle.csv.zst", after_bytes=len(lichess_zst) // 8, times=4)  # > the 3 retries
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache")
    assert res.exit_code == 1 and "a re-run resumes from there" in " ".join(res.output.split())
    part = part_path(tmp_path / "cache" / "chess_puzzles" / "lichess-puzzles" / "lichess_db_puzzle.csv.zst")
    kept = part.stat().st_size
    assert kept > 0
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache", "-o", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["sources"][0]["action"] == "resumed"
    assert files_server.requests[-1] == ("/lichess_db_puzzle.csv.zst", f"bytes={kept}-")


def test_an_unknown_source_name_is_refused_naming_the_field(files_server, tmp_path):
    path = manifest(tmp_path, "chess_puzzles", {"sources": [{"name": "lichess", "url": files_server.url("x")}]})
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache")
    assert res.exit_code == 1
    assert (
        "spec.experiment.data.sources[0].name: 'lichess' is not a source of chess_puzzles; its sources are lichess-puzzles"
        in " ".join(res.output.split())
    )


def test_workloads_refuse_an_unprepared_store_and_say_how_to_prepare(tmp_path):
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "chess_puzzles",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 4},
            "data": {"source": "full"},
        }
    )
    domain = plugins.load("chess_puzzles")
    with pytest.raises(full.FullDataError, match="whale prepare"):
        domain.load_split("weight", spec.experiment.data, open_store(str(tmp_path / "st")))
    with pytest.raises(full.FullDataError, match="whale prepare"):
        domain.load_split("weight", spec.experiment.data, None)


def test_the_prepare_workload_fetches_the_full_data_for_a_run(files_server, tmp_path, lichess_zst, monkeypatch):
    """What the operator's prepare Job runs: the run's spec in the store -> sources, splits, then split sizes."""
    monkeypatch.setenv("WHALE_CACHE_DIR", str(tmp_path / "cache"))
    store = open_store(str(tmp_path / "st"))
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "chess_puzzles",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 4},
            "data": {"source": "full", **chess_data(files_server, lichess_zst)},
        }
    )
    store.write_json(layout.spec_key("chess"), spec.to_wire())
    sizes = prepare.main(store, "chess", "prepare")
    assert sizes == {"weight": 100, "harness": 20, "test": 20} == store.read_json(layout.split_sizes_key("chess"))


# ----- math: a DAPO-shaped parquet ----------------------------------------------------------------

DAPO_HEAD = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'


def dapo_parquet(distinct: int, repeats: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"{DAPO_HEAD}What is {i} + {i}?{DAPO_TAIL}"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"idx-{i}-{r}"},
        }
        for r in range(repeats)
        for i in range(distinct)
    ]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


def test_math_full_data_dedups_dapo_and_draws_d_harness_from_the_pool(files_server, tmp_path):
    blob = dapo_parquet(distinct=300, repeats=3)
    files_server.files["/dapo.parquet"] = blob
    data = {
        "seed": 42,
        "weightSize": 250,
        "harnessSize": 16,
        "sources": [{"name": "dapo-math-17k", "url": files_server.url("dapo.parquet"), "sha256": sha(blob)}],
    }
    spec = WhaleRunSpec.model_validate(yaml.safe_load(manifest(tmp_path, "math_reasoning", data).read_text())["spec"])
    store = open_store(str(tmp_path / "st"))
    domain = plugins.load("math_reasoning")
    result = prepare.prepare_data(domain, spec, store, cache_dir=tmp_path / "cache")
    assert result.sizes == {"weight": 250, "harness": 16, "test": 60}
    assert result.manifest["stats"]["dapoRows"] == 900 and result.manifest["stats"]["dapoDistinct"] == 300
    weight = domain.load_split("weight", spec.experiment.data, store)
    harness = domain.load_split("harness", spec.experiment.data, store)
    assert weight[0] == {"id": "dapo-0", "problem": "What is 0 + 0?", "answer": "0", "source": "dapo-math-17k"}
    pool = {r["id"] for r in dapo_rows_all(300)}
    assert {r["id"] for r in harness} <= pool  # drawn from the same pool, as the paper
    assert {r["id"] for r in domain.load_split("test", spec.experiment.data, store)} >= {"2024-I-1", "2025-II-15"}


def dapo_rows_all(n: int) -> list[dict]:
    return [{"id": f"dapo-{i}"} for i in range(n)]


def test_math_full_sizes_are_the_papers_without_any_data():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "math_reasoning",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 4},
            "data": {"source": "full"},
        }
    )
    assert plugins.load("math_reasoning").split_sizes(spec.experiment.data) == {
        "weight": 17_917,
        "harness": 256,
        "test": 60,
    }


def test_a_file_that_gives_other_sizes_than_the_papers_fails_the_preparation(files_server, tmp_path):
    blob = dapo_parquet(distinct=300, repeats=2)  # 300 distinct problems, not the 17,917 of the pinned file
    files_server.files["/dapo.parquet"] = blob
    data = {
        "harnessSize": 16,
        "sources": [{"name": "dapo-math-17k", "url": files_server.url("dapo.parquet"), "sha256": sha(blob)}],
    }  # another file than the paper's, pinned
    res = run_prepare(manifest(tmp_path, "math_reasoning", data), tmp_path / "st", tmp_path / "cache")
    assert res.exit_code == 1
    assert "the paper's preparation {'weight': 17917" in " ".join(res.output.split())


def test_a_mirror_serving_another_file_than_the_pinned_one_is_refused(files_server, tmp_path):
    from math_reasoning.full import DAPO

    blob = dapo_parquet(distinct=10, repeats=2)
    files_server.files["/dapo.parquet"] = blob
    data = {"sources": [{"name": "dapo-math-17k", "url": files_server.url("dapo.parquet")}]}
    res = run_prepare(manifest(tmp_path, "math_reasoning", data), tmp_path / "st", tmp_path / "cache")
    assert res.exit_code == 1
    text = "".join(res.output.split())
    assert DAPO.sha256 in text and sha(blob) in text and files_server.url("dapo.parquet") in text


# ----- search QA: FlashRAG-shaped JSON lines ------------------------------------------------------


def flashrag(prefix: str, n: int) -> bytes:
    return "".join(
        json.dumps(
            {
                "id": f"{prefix}_{i}",
                "question": f"{prefix} question {i}?",
                "golden_answers": [f"answer {i}"],
                "metadata": {"x": i},
            }
        )
        + "\n"
        for i in range(n)
    ).encode()


def test_search_full_data_merges_nq_and_hotpotqa_and_samples_seven_benchmarks(files_server, tmp_path):
    from search_qa.full import TEST_SETS, TRAIN_SETS

    pins = []
    for dataset, (name, _path) in TRAIN_SETS.items():
        files_server.files[f"/{name}.jsonl"] = flashrag(f"{dataset}-train", 60)
        pins.append({"name": name, "url": files_server.url(f"{name}.jsonl")})
    files_server.files["/hotpotqa-train.jsonl"] += flashrag("nq-train", 5)  # repeats of NQ questions: dropped
    for bench, (name, _path, _rows) in TEST_SETS.items():
        files_server.files[f"/{name}.jsonl"] = flashrag(f"{bench}-test", 8)
        pins.append({"name": name, "url": files_server.url(f"{name}.jsonl")})
    data = {"seed": 42, "weightSize": 80, "harnessSize": 10, "testSize": 3, "corpus": "local", "sources": pins}
    spec = WhaleRunSpec.model_validate(yaml.safe_load(manifest(tmp_path, "search_qa", data).read_text())["spec"])
    store = open_store(str(tmp_path / "st"))
    domain = plugins.load("search_qa")
    result = prepare.prepare_data(domain, spec, store, tool_data=False, cache_dir=tmp_path / "cache")
    assert result.sizes == {"weight": 80, "harness": 10, "test": 21}
    assert result.manifest["stats"]["trainDistinct"] == 120
    weight = domain.load_split("weight", spec.experiment.data, store)
    harness = domain.load_split("harness", spec.experiment.data, store)
    test = domain.load_split("test", spec.experiment.data, store)
    assert all(r["id"].startswith("nq/") for r in harness) and {r["id"] for r in harness} <= {r["id"] for r in weight}
    assert sorted({r["subset"] for r in test}) == sorted(TEST_SETS) and len(test) == 21
    assert domain.notes() == []  # all seven benchmarks are there


def test_a_file_that_is_not_a_zstd_csv_fails_with_the_file_named(files_server, tmp_path):
    blob = b"<html>not the database</html>" * 100
    path = manifest(tmp_path, "chess_puzzles", chess_data(files_server, blob))
    res = run_prepare(path, tmp_path / "st", tmp_path / "cache")
    assert res.exit_code == 1
    assert "not a readable zstd-compressed Lichess CSV" in " ".join(res.output.split())


def test_a_decompression_bomb_is_cut_at_the_row_limit(tmp_path):
    from chess_puzzles.full import read_zst_csv

    header = SAMPLE_CSV.read_text().splitlines()[0]
    row = SAMPLE_CSV.read_text().splitlines()[1]
    path = tmp_path / "bomb.csv.zst"
    path.write_bytes(zstd(("\n".join([header] + [row] * 5000) + "\n").encode()))
    with pytest.raises(full.FullDataError, match="more than 1,000 rows"):
        list(read_zst_csv(path, max_rows=1000))


def test_a_file_that_is_not_the_dapo_parquet_fails_with_the_file_named(files_server, tmp_path):
    blob = b"not a parquet file" * 50
    files_server.files["/dapo.parquet"] = blob
    data = {
        "harnessSize": 16,
        "sources": [{"name": "dapo-math-17k", "url": files_server.url("dapo.parquet"), "sha256": sha(blob)}],
    }
    res = run_prepare(manifest(tmp_path, "math_reasoning", data), tmp_path / "st", tmp_path / "cache")
    assert res.exit_code == 1
    assert "not the DAPO-Math-17k parquet" in " ".join(res.output.split())
