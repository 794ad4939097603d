"""Download one file over HTTP(S): resumable, bounded, and checked against a SHA-256.

The full datasets of the paper (the Lichess puzzle database, DAPO-Math-17k, Search-R1's QA sets) are
hundreds of megabytes each, fetched by the prepare phase. A download goes to ``<dest>.part``; an
interrupted one is resumed with an HTTP ``Range`` request (a server that ignores it makes the download
start over); the finished file's SHA-256 is compared with the expected one, and only a matching file is
renamed into place. Every download is bounded: in bytes (``max_bytes``), per read (``read_timeout_s``)
and in total (``deadline_s``, checked with an injectable clock). Transport errors are retried
``retries`` times, each retry resuming where the last stopped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a download starts: `whale validate` of a full-data run loads this module
    import httpx

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
#: a source larger than this is refused unless it says otherwise [the largest here: ~300 MB]
DEFAULT_MAX_BYTES = 8 << 30
DEFAULT_DEADLINE_S = 6 * 3600.0
DEFAULT_CONNECT_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 3


class FetchError(RuntimeError):
    """A download failed; the message names the URL and what to do."""


class ChecksumMismatch(FetchError):
    """The downloaded bytes are not the expected ones (a changed or corrupted file)."""

    def __init__(self, url: str, expected: str, actual: str, what: str = "download"):
        self.url, self.expected, self.actual = url, expected, actual
        super().__init__(
            f"{url}: the {what} has SHA-256 {actual}, expected {expected}; the file changed upstream or was "
            "corrupted. Nothing was kept. If the new file is the one you mean, pin its digest in "
            "spec.experiment.data.sources (sha256), or point url at a mirror of the expected file"
        )


@dataclass(frozen=True)
class Fetched:
    """A verified file on disk."""

    path: Path
    sha256: str
    bytes: int
    #: how many bytes of it an earlier, interrupted download had already written
    resumed_from: int = 0


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def download(
    url: str,
    dest: Path,
    *,
    expected_sha256: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    deadline_s: float = DEFAULT_DEADLINE_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    retries: int = DEFAULT_RETRIES,
    clock: Callable[[], float] = time.monotonic,
    client: httpx.Client | None = None,
) -> Fetched:
    """Fetch ``url`` to ``dest`` (atomically: ``dest`` appears only complete and verified).

    ``expected_sha256`` None: any content is accepted and its digest returned (the caller records it
    and verifies it on re-use). A mismatch deletes the partial file and raises :class:`ChecksumMismatch`."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    start = clock()
    import httpx

    own = client is None
    http = client or httpx.Client(
        timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s), follow_redirects=True
    )
    resumed_from = part.stat().st_size if part.exists() else 0
    try:
        attempt = 0
        while True:
            try:
                _fetch_into(http, url, part, max_bytes=max_bytes, deadline=start + deadline_s, clock=clock)
                break
            except httpx.TransportError as exc:
                attempt += 1
                if attempt > retries:
                    raise FetchError(
                        f"{url}: {type(exc).__name__}: {exc} (after {retries} retries; "
                        f"{part.stat().st_size if part.exists() else 0} bytes kept in {part}, "
                        "a re-run resumes from there)"
                    ) from None
                log.warning("%s: %s; retry %d of %d resumes the download", url, exc, attempt, retries)
    finally:
        if own:
            http.close()
    actual = sha256_file(part)
    if expected_sha256 is not None and actual != expected_sha256:
        part.unlink(missing_ok=True)
        raise ChecksumMismatch(url, expected_sha256, actual)
    size = part.stat().st_size
    os.replace(part, dest)
    return Fetched(dest, actual, size, resumed_from)


def _fetch_into(
    http: httpx.Client, url: str, part: Path, *, max_bytes: int, deadline: float, clock: Callable[[], float]
) -> None:
    """One HTTP request appending to ``part`` from its current size (a Range request when > 0)."""
    import httpx

    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    with http.stream("GET", url, headers=headers) as resp:
        if resp.status_code == 416 and have:
            total = _total_from_content_range(resp.headers.get("content-range"))
            if total == have:
                return  # the part file is already the whole file
            part.unlink()  # larger than the file now: start over
            raise httpx.RemoteProtocolError("range not satisfiable; the partial file was dropped")
        if resp.status_code not in (200, 206):
            raise FetchError(
                f"{url}: HTTP {resp.status_code} {resp.reason_phrase}; check the URL (spec.experiment.data.sources "
                "can point a source at a mirror)"
            )
        append = resp.status_code == 206 and have > 0
        if have and not append:
            log.info("%s: the server ignored the range request; downloading from the start", url)
            have = 0
        declared = resp.headers.get("content-length")
        if declared is not None and declared.isdigit() and have + int(declared) > max_bytes:
            raise FetchError(
                f"{url}: {have + int(declared)} bytes is more than the limit of {max_bytes} bytes "
                "for this source; is it the right file?"
            )
        with part.open("ab" if append else "wb") as fh:
            written = have
            for chunk in resp.iter_bytes():  # as the data arrives: a cut connection keeps what came
                written += len(chunk)
                if written > max_bytes:
                    fh.close()
                    part.unlink(missing_ok=True)
                    raise FetchError(
                        f"{url}: more than the limit of {max_bytes} bytes for this source; is it the right file?"
                    )
                fh.write(chunk)
                if clock() > deadline:
                    raise FetchError(
                        f"{url}: not finished by its deadline; {written} bytes kept in {part}, "
                        "a re-run resumes from there"
                    )


def _total_from_content_range(value: str | None) -> int | None:
    """``bytes */1234`` -> 1234."""
    if not value or "/" not in value:
        return None
    total = value.rsplit("/", 1)[1].strip()
    return int(total) if total.isdigit() else None
