"""Materialised chess splits in a real store (local folder and S3 on loopback): written once with a
manifest of counts and hashes, re-used while it matches, repaired when a file is damaged."""

from __future__ import annotations

import hashlib

import pytest

from chess_puzzles import prep
from whale import domains, layout
from whale.spec import Data
from whale.store import open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return request.getfixturevalue("s3_store")


def test_splits_are_materialised_once_with_a_manifest(store, monkeypatch):
    domain = domains.load("chess_puzzles")
    data = Data()
    items = domain.load_split("test", data, store)
    assert items == domain.load_split("test", data, None)  # store and memory agree
    assert len(items) == 256 and all(item["id"] == item["PuzzleId"] for item in items)

    manifest = prep.materialise(store, data)
    prefix = prep.split_prefix(manifest["config"])
    assert prefix.startswith(layout.data_prefix("chess_puzzles") + "/")
    assert set(store.list(prefix)) == {
        f"{prefix}/{n}" for n in ("manifest.json", "weight.jsonl", "harness.jsonl", "test.jsonl")
    }
    for name, entry in manifest["splits"].items():
        raw = store.read_bytes(f"{prefix}/{name}.jsonl")
        assert hashlib.sha256(raw).hexdigest() == entry["sha256"]
        assert raw.count(b"\n") == entry["count"]
        assert sum(entry["solverPlies"].values()) == entry["count"]
    assert {n: e["count"] for n, e in manifest["splits"].items()} == domain.split_sizes(data)
    assert manifest["source"] == {"file": prep.SOURCE_FILE, "rows": 2995}

    def no_writes(key, data):
        raise AssertionError(f"re-used splits must not be rewritten ({key})")

    with monkeypatch.context() as patch:
        patch.setattr(store, "write_bytes", no_writes)
        assert prep.materialise(store, data) == manifest
        assert domain.load_split("harness", data, store) == domain.load_split("harness", data, None)

    store.write_bytes(f"{prefix}/test.jsonl", b"{}\n")  # damaged: the hash no longer matches
    assert prep.materialise(store, data) == manifest
    assert domain.load_split("test", data, store) == items


def test_other_settings_live_beside_the_first(tmp_path):
    store = open_store(str(tmp_path))
    first = prep.materialise(store, Data())
    second = prep.materialise(store, Data(seed=3, test_size=64))
    assert prep.split_prefix(first["config"]) != prep.split_prefix(second["config"])
    assert second["splits"]["test"]["count"] == 64
    assert len(store.list(layout.data_prefix("chess_puzzles"))) == 8
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        prep.load_split(store, Data(), "dev")
