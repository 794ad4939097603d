"""whale.data.fetch against a real HTTP server on loopback: resume, checksum, bounds, bad servers."""

from __future__ import annotations

import hashlib

import pytest

from tests.fixtures.files_server import _files_server, files_server  # noqa: F401 - fixtures
from whale.data.fetch import ChecksumMismatch, FetchError, download, part_path

BODY = bytes(range(256)) * 4096  # 1 MiB
DIGEST = hashlib.sha256(BODY).hexdigest()


def test_a_download_is_verified_and_lands_atomically(files_server, tmp_path):
    files_server.files["/d/file.bin"] = BODY
    got = download(files_server.url("d/file.bin"), tmp_path / "file.bin", expected_sha256=DIGEST)
    assert (got.sha256, got.bytes, got.resumed_from) == (DIGEST, len(BODY), 0)
    assert (tmp_path / "file.bin").read_bytes() == BODY
    assert not part_path(tmp_path / "file.bin").exists()


def test_an_interrupted_download_resumes_with_a_range_request(files_server, tmp_path):
    files_server.files["/file.bin"] = BODY
    files_server.cut("file.bin", after_bytes=300_000, times=1)
    dest = tmp_path / "file.bin"
    with pytest.raises(FetchError, match="a re-run resumes from there"):
        download(files_server.url("file.bin"), dest, expected_sha256=DIGEST, retries=0)
    kept = part_path(dest).stat().st_size
    assert 0 < kept <= 300_000 and not dest.exists()
    got = download(files_server.url("file.bin"), dest, expected_sha256=DIGEST, retries=0)
    assert got.resumed_from == kept and got.sha256 == DIGEST and dest.read_bytes() == BODY
    assert files_server.requests[-1] == ("/file.bin", f"bytes={kept}-")


def test_a_cut_connection_is_retried_from_where_it_stopped(files_server, tmp_path):
    files_server.files["/file.bin"] = BODY
    files_server.cut("file.bin", after_bytes=100_000, times=2)
    got = download(files_server.url("file.bin"), tmp_path / "f", expected_sha256=DIGEST, retries=3)
    assert got.sha256 == DIGEST
    ranges = [r for _, r in files_server.requests]
    assert ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:]) and len(ranges) == 3


def test_a_server_that_ignores_range_restarts_the_download(files_server, tmp_path):
    files_server.files["/file.bin"] = BODY
    dest = tmp_path / "file.bin"
    part_path(dest).write_bytes(b"garbage from an older attempt")
    files_server.ignore_range = True
    got = download(files_server.url("file.bin"), dest, expected_sha256=DIGEST)
    assert got.sha256 == DIGEST and dest.read_bytes() == BODY


def test_a_corrupted_file_is_refused_naming_the_url_and_both_digests(files_server, tmp_path):
    files_server.files["/file.bin"] = BODY[:-1] + b"\x00"
    dest = tmp_path / "file.bin"
    url = files_server.url("file.bin")
    with pytest.raises(ChecksumMismatch) as info:
        download(url, dest, expected_sha256=DIGEST)
    actual = hashlib.sha256(files_server.files["/file.bin"]).hexdigest()
    assert url in str(info.value) and DIGEST in str(info.value) and actual in str(info.value)
    assert not dest.exists() and not part_path(dest).exists()


def test_a_file_over_its_size_limit_is_refused(files_server, tmp_path):
    files_server.files["/file.bin"] = BODY
    with pytest.raises(FetchError, match="more than the limit of 1000 bytes"):
        download(files_server.url("file.bin"), tmp_path / "f", max_bytes=1000)
    assert not part_path(tmp_path / "f").exists()


def test_a_missing_file_names_the_url_and_the_status(files_server, tmp_path):
    url = files_server.url("nope.bin")
    with pytest.raises(FetchError, match=f"{url}: HTTP 404"):
        download(url, tmp_path / "f")


def test_the_deadline_bounds_a_download(files_server, tmp_path):
    files_server.files["/file.bin"] = BODY * 3
    ticks = iter(range(1000))
    with pytest.raises(FetchError, match="not finished by its deadline"):
        download(files_server.url("file.bin"), tmp_path / "f", deadline_s=1.5, clock=lambda: float(next(ticks)))
    assert part_path(tmp_path / "f").exists()  # kept: a later run resumes
