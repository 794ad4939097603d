"""spec.experiment.data.source / spec.experiment.data.sources: strict, bounded, and every refusal names the field and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from whale.core.spec import Data

SHA = "a" * 64


def test_the_sample_files_stay_the_default():
    assert Data().source == "sample" and Data().sources == []


@pytest.mark.parametrize(
    "url, why",
    [
        ("ftp://mirror.example/lichess.csv.zst", "pattern"),
        ("file:///etc/passwd", "pattern"),
        ("https://mirror.example/a b", "pattern"),
        ("https://mirror.example/" + "x" * 2048, "at most 2048"),
    ],
)
def test_a_source_url_is_http_and_bounded(url, why):
    with pytest.raises(ValidationError, match=why):
        Data(source="full", sources=[{"name": "lichess-puzzles", "url": url}])


@pytest.mark.parametrize("digest", ["A" * 64, "a" * 63, "g" * 64, 123])
def test_a_pinned_digest_is_64_lowercase_hex_digits(digest):
    with pytest.raises(ValidationError):
        Data(source="full", sources=[{"name": "lichess-puzzles", "sha256": digest}])


def test_sources_are_bounded_unique_and_only_for_full_data():
    with pytest.raises(ValidationError, match="at most 32"):
        Data(source="full", sources=[{"name": f"s{i}"} for i in range(33)])
    with pytest.raises(ValidationError, match="'nq-train' is listed twice"):
        Data(source="full", sources=[{"name": "nq-train"}, {"name": "nq-train", "sha256": SHA}])
    with pytest.raises(ValidationError, match="set source: full or remove sources"):
        Data(sources=[{"name": "nq-train", "sha256": SHA}])
    with pytest.raises(ValidationError):
        Data(source="paper")
    pin = Data(source="full", sources=[{"name": "nq-train", "url": "https://mirror.example/nq.jsonl", "sha256": SHA}])
    assert pin.sources[0].url == "https://mirror.example/nq.jsonl"


def test_a_pin_applies_to_its_source_and_an_unknown_name_is_refused():
    from chess_puzzles.full import FULL, LICHESS
    from whale.data.full import FullDataError, resolve_sources

    mirror = "https://mirror.example/puzzles-2026-01.csv.zst"
    (src,) = resolve_sources(
        FULL, Data(source="full", sources=[{"name": "lichess-puzzles", "url": mirror, "sha256": SHA}])
    )
    assert (src.url, src.sha256, src.filename) == (mirror, SHA, LICHESS.filename)
    with pytest.raises(
        FullDataError, match=r"spec.experiment.data.sources\[0\].name: 'dapo' is not a source of chess_puzzles"
    ):
        resolve_sources(FULL, Data(source="full", sources=[{"name": "dapo"}]))


def test_a_mirror_of_a_pinned_source_must_serve_the_pinned_file():
    from math_reasoning.full import DAPO, FULL
    from whale.data.full import resolve_sources

    (default,) = resolve_sources(FULL, Data(source="full"))
    assert default.sha256 == DAPO.sha256 and DAPO.revision in default.url
    (mirrored,) = resolve_sources(
        FULL, Data(source="full", sources=[{"name": "dapo-math-17k", "url": "https://mirror.example/dapo.parquet"}])
    )
    assert mirrored.sha256 == DAPO.sha256  # the same file from elsewhere; pin another digest to take another file
