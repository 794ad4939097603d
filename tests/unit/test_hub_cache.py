"""`whale.hub.cache_lookup` reads the Hugging Face cache without importing huggingface_hub (issue #32: that import
cost `whale validate` more than the rest of its start-up); it must answer what huggingface_hub answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from whale.hub import cache_lookup

huggingface_hub = pytest.importorskip("huggingface_hub")

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def hf_cache(root: Path) -> Path:
    """A cache as huggingface_hub lays it out: main and a tag point at SHA; OTHER is a second snapshot; a
    .no_exist marker says the Hub has no tokenizer.json at SHA."""
    repo = root / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SHA)
    (repo / "refs" / "v1").write_text(SHA)
    for sha, files in ((SHA, ["config.json", "model.gguf"]), (OTHER, ["config.json"])):
        (repo / "snapshots" / sha).mkdir(parents=True)
        for f in files:
            (repo / "snapshots" / sha / f).write_text("{}")
    (repo / ".no_exist" / SHA).mkdir(parents=True)
    (repo / ".no_exist" / SHA / "tokenizer.json").write_text("")
    return root


@pytest.mark.parametrize(
    ("model", "filename", "revision"),
    [
        ("org/tiny", "config.json", None),
        ("org/tiny", "model.gguf", "main"),
        ("org/tiny", "config.json", "v1"),
        ("org/tiny", "config.json", OTHER),
        ("org/tiny", "model.gguf", OTHER),  # not in that snapshot
        ("org/tiny", "tokenizer.json", None),  # the Hub said it has none
        ("org/tiny", "config.json", "dev"),  # no such ref
        ("org/other", "config.json", None),  # no such model
    ],
)
def test_cache_lookup_answers_as_huggingface_hub(tmp_path, model, filename, revision):
    cache = hf_cache(tmp_path)
    theirs = huggingface_hub.try_to_load_from_cache(model, filename, cache_dir=cache, revision=revision)
    ours = cache_lookup(cache, model, filename, revision)
    assert ours == (Path(theirs) if isinstance(theirs, str) else None)


def test_a_cached_file_is_found_and_a_missing_one_is_not(tmp_path):
    """The table above could pass with both answering None throughout."""
    cache = hf_cache(tmp_path)
    assert (
        cache_lookup(cache, "org/tiny", "config.json")
        == cache / "models--org--tiny" / "snapshots" / SHA / "config.json"
    )
    assert cache_lookup(cache, "org/tiny", "tokenizer.json") is None
