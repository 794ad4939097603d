"""The full datasets (``spec.experiment.data.source: full``): fetched, verified, split, kept in the store.

A domain that supports the paper's full data describes it with a :class:`FullData`: its named
:class:`Source` files (URL, pinned revision and digest where one can be pinned), the split sizes the
preparation produces, and a ``build`` function turning the fetched files into the three splits. This
module does the rest, the same way for every domain:

1. **fetch** (:func:`ensure_sources`): each source is downloaded once (resumable, ``whale.data.fetch``)
   into a local cache, checked against its pinned SHA-256 when it has one, and copied into the store
   under ``data/<domain>/sources/<name>/<file>``. ``data/<domain>/sources/manifest.json`` records, per
   source, the URL, the SHA-256, the size and when it was fetched; it is rewritten after each source,
   so an interrupted preparation keeps what it finished. On re-use every file's digest is checked
   against the manifest (a changed or corrupted file is refused, naming the URL and both digests);
   a source whose URL or pin changed is fetched again.
2. **split** (:func:`materialise`): ``build`` makes the splits; they are written to
   ``data/<domain>/full-<tag>/{weight,harness,test}.jsonl`` with ``manifest.json`` LAST (counts,
   SHA-256 per split, the source digests and the settings). The tag hashes the settings and the
   source digests, so a new Lichess month or other sizes sit beside the old ones.
3. **read** (:func:`load_split`): the workloads read a split from the store, its digest checked
   against the manifest. Nothing is downloaded there: an unprepared store is an error that says to
   run ``whale prepare`` (locally) or to let the prepare Job finish (cluster).

A second preparation with everything in place downloads nothing and writes nothing.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from whale.core import layout
from whale.data.fetch import ChecksumMismatch, Fetched, download, sha256_file

if TYPE_CHECKING:
    from whale.core.spec import Data
    from whale.store import Store

log = logging.getLogger(__name__)

SPLITS = ("weight", "harness", "test")
SOURCES_MANIFEST = "manifest.json"

Row = dict[str, Any]


class FullDataError(ValueError):
    """The full data cannot be prepared or read; the message names the field, file or URL and the fix."""


@dataclass(frozen=True)
class Source:
    """One file of a domain's full data."""

    #: the name ``spec.experiment.data.sources[].name`` uses, e.g. ``lichess-puzzles``
    name: str
    url: str
    #: the file name in the cache and the store
    filename: str
    #: the digest the download must have; None where nothing can be pinned (recorded at the first
    #: fetch, then verified on every re-use)
    sha256: str | None = None
    #: what ``url`` pins (a dataset commit, a release), for the manifest and the docs
    revision: str | None = None
    max_bytes: int = 8 << 30
    description: str = ""


def split_settings(data: Data) -> dict[str, Any]:
    """The spec.experiment.data settings every domain's splits depend on: the seed and the three split sizes."""
    return {
        "seed": data.seed,
        "harnessSize": data.harness_size,
        "weightSize": data.weight_size,
        "testSize": data.test_size,
    }


@dataclass(frozen=True)
class FullData:
    """What a domain supplies for ``source: full``."""

    domain: str
    sources: tuple[Source, ...]
    #: bump when the split logic changes, so stale splits in a store are not re-used
    version: int
    #: the split sizes a preparation with these settings produces (cheap: `whale plan` calls it)
    sizes: Callable[[Data], dict[str, int]]
    #: fetched files (by source name) + settings -> (splits, statistics for the manifest)
    build: Callable[[Mapping[str, Path], Data], tuple[dict[str, list[Row]], dict[str, Any]]]
    #: spec.experiment.data settings that change the splits (they enter the tag); a domain with more overrides it
    settings: Callable[[Data], dict[str, Any]] = split_settings


# ----- sources ------------------------------------------------------------------------------------


def resolve_sources(full: FullData, data: Data) -> tuple[Source, ...]:
    """The domain's sources with ``spec.experiment.data.sources`` applied (a mirror URL, a pinned digest)."""
    by_name = {s.name: s for s in full.sources}
    pins = {}
    for i, pin in enumerate(data.sources):
        if pin.name not in by_name:
            raise FullDataError(
                f"spec.experiment.data.sources[{i}].name: {pin.name!r} is not a source of {full.domain}; its sources are "
                f"{', '.join(by_name)}"
            )
        pins[pin.name] = pin
    out = []
    for src in full.sources:
        pinned = pins.get(src.name)
        if pinned is None:
            out.append(src)
            continue
        # a mirror serves the same file: the domain's pinned digest still applies unless the pin names another
        out.append(
            Source(
                src.name,
                pinned.url or src.url,
                src.filename,
                pinned.sha256 or src.sha256,
                src.revision,
                src.max_bytes,
                src.description,
            )
        )
    return tuple(out)


def sources_prefix(domain: str) -> str:
    return f"{layout.data_prefix(domain)}/sources"


def source_key(domain: str, src: Source) -> str:
    return f"{sources_prefix(domain)}/{src.name}/{src.filename}"


def default_cache_dir() -> Path:
    """$WHALE_DOWNLOADS_DIR (the prepare Job's scratch volume), else $WHALE_CACHE_DIR/downloads, else
    ~/.cache/whale/downloads."""
    if os.environ.get("WHALE_DOWNLOADS_DIR"):
        return Path(os.environ["WHALE_DOWNLOADS_DIR"])
    base = os.environ.get("WHALE_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "whale") / "downloads"


@dataclass(frozen=True)
class SourceReport:
    """What one preparation did with one source (``whale prepare`` prints it)."""

    name: str
    url: str
    sha256: str
    bytes: int
    #: fetched | resumed | reused
    action: str


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ensure_sources(
    store: Store, full: FullData, data: Data, cache_dir: Path | None = None, *, fetch: Callable[..., Fetched] = download
) -> tuple[dict[str, Path], list[SourceReport]]:
    """Every source of ``full`` verified on local disk and in the store; returns their local paths and
    what was done. Idempotent: with everything in place nothing is downloaded or written."""
    cache = (cache_dir or default_cache_dir()) / full.domain
    manifest_key = f"{sources_prefix(full.domain)}/{SOURCES_MANIFEST}"
    manifest: dict[str, Any] = store.read_json_or_none(manifest_key) or {}
    paths: dict[str, Path] = {}
    reports: list[SourceReport] = []
    for src in resolve_sources(full, data):
        local = cache / src.name / src.filename
        key = source_key(full.domain, src)
        record = manifest.get(src.name)
        if _record_matches(record, src) and store.exists(key):
            _verified_copy(store, key, local, record, src)
            paths[src.name] = local
            reports.append(SourceReport(src.name, src.url, record["sha256"], record["bytes"], "reused"))
            continue
        log.info("%s: fetching %s", full.domain, src.url)
        got = fetch(src.url, local, expected_sha256=src.sha256, max_bytes=src.max_bytes)
        store.upload_file(local, key)
        manifest[src.name] = {
            "url": src.url,
            "key": key,
            "sha256": got.sha256,
            "bytes": got.bytes,
            "fetchedAt": _now(),
            "pinned": src.sha256 is not None,
            "revision": src.revision,
        }
        store.write_json(manifest_key, manifest)  # after each source: an interruption keeps what is done
        paths[src.name] = local
        reports.append(
            SourceReport(src.name, src.url, got.sha256, got.bytes, "resumed" if got.resumed_from else "fetched")
        )
    return paths, reports


def _record_matches(record: Any, src: Source) -> TypeGuard[dict[str, Any]]:
    return (
        isinstance(record, dict)
        and record.get("url") == src.url
        and isinstance(record.get("sha256"), str)
        and (src.sha256 is None or record["sha256"] == src.sha256)
    )


def _verified_copy(store: Store, key: str, local: Path, record: dict[str, Any], src: Source) -> None:
    """``local`` holds the stored file with the manifest's digest (from the cache when it is intact)."""
    expected = record["sha256"]
    if local.is_file() and local.stat().st_size == record.get("bytes") and sha256_file(local) == expected:
        return
    store.download_file(key, local)
    actual = sha256_file(local)
    if actual != expected:
        local.unlink(missing_ok=True)
        raise ChecksumMismatch(src.url, expected, actual, what=f"stored copy {store.uri_for(key)}")


def source_digests(store: Store, full: FullData, data: Data) -> dict[str, str]:
    """The recorded SHA-256 of every source (the splits' tag depends on them); FullDataError when the
    sources were never fetched into this store."""
    manifest = store.read_json_or_none(f"{sources_prefix(full.domain)}/{SOURCES_MANIFEST}") or {}
    out = {}
    for src in resolve_sources(full, data):
        record = manifest.get(src.name)
        if not _record_matches(record, src):
            raise FullDataError(not_prepared(store, full.domain, f"source {src.name} ({src.url}) was not fetched"))
        out[src.name] = record["sha256"]
    return out


def not_prepared(store: Store, domain: str, what: str) -> str:
    return (
        f"spec.experiment.data.source full: {what} into {store.uri_for(layout.data_prefix(domain))}; prepare the data first: "
        "`whale prepare FILE.yaml --store <the run's store>` locally (the operator's prepare Job does it on a "
        "cluster)"
    )


# ----- splits -------------------------------------------------------------------------------------


def config_of(full: FullData, data: Data, digests: Mapping[str, str]) -> dict[str, Any]:
    return {
        "domain": full.domain,
        "version": full.version,
        "sources": dict(sorted(digests.items())),
        "sizes": full.sizes(data),
        **full.settings(data),
    }


def split_prefix(full: FullData, config: Mapping[str, Any]) -> str:
    tag = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    return f"{layout.data_prefix(full.domain)}/full-{tag}"


def split_bytes(rows: Sequence[Row]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def _manifest_ok(store: Store, prefix: str, manifest: Any, config: Mapping[str, Any]) -> bool:
    if not isinstance(manifest, dict) or manifest.get("config") != config:
        return False
    for name in SPLITS:
        entry = manifest.get("splits", {}).get(name) or {}
        key = f"{prefix}/{name}.jsonl"
        if not store.exists(key) or hashlib.sha256(store.read_bytes(key)).hexdigest() != entry.get("sha256"):
            return False
    return True


def materialise(
    store: Store, full: FullData, data: Data, cache_dir: Path | None = None, *, fetch: Callable[..., Fetched] = download
) -> tuple[dict[str, Any], list[SourceReport]]:
    """Fetch (or re-use) the sources and write the splits once; returns (splits manifest, source reports)."""
    paths, reports = ensure_sources(store, full, data, cache_dir, fetch=fetch)
    digests = {r.name: r.sha256 for r in reports}
    config = config_of(full, data, digests)
    prefix = split_prefix(full, config)
    manifest_key = f"{prefix}/manifest.json"
    existing = store.read_json_or_none(manifest_key)
    if existing is not None and _manifest_ok(store, prefix, existing, config):
        return existing, reports
    splits, stats = full.build(paths, data)
    sizes = {name: len(splits[name]) for name in SPLITS}
    declared = full.sizes(data)
    if sizes != declared:
        raise FullDataError(
            f"{full.domain}: the fetched data gives splits of {sizes} items, the paper's preparation {declared} "
            f"(sources {', '.join(f'{k} {v[:12]}' for k, v in digests.items())}); the source files differ from the "
            "ones this preparation was written for: pin the expected files in spec.experiment.data.sources"
        )
    entries = {}
    for name in SPLITS:
        blob = split_bytes(splits[name])
        store.write_bytes(f"{prefix}/{name}.jsonl", blob)
        entries[name] = {"count": len(splits[name]), "sha256": hashlib.sha256(blob).hexdigest(), "key": f"{name}.jsonl"}
    manifest = {"config": config, "splits": entries, "stats": stats, "preparedAt": _now()}
    store.write_json(manifest_key, manifest)  # last: its presence means the splits are complete
    return manifest, reports


def load_split(store: Store | None, full: FullData, data: Data, split: str) -> list[Row]:
    """One prepared split from the store, its digest checked against the manifest."""
    if split not in SPLITS:
        raise FullDataError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if store is None:
        raise FullDataError(
            f"spec.experiment.data.source full: the {full.domain} splits live in the run's store, and this "
            "process has none; prepare the data with `whale prepare FILE.yaml --store URI` and "
            "run with the same store"
        )
    config = config_of(full, data, source_digests(store, full, data))
    prefix = split_prefix(full, config)
    manifest = store.read_json_or_none(f"{prefix}/manifest.json")
    if not isinstance(manifest, dict) or manifest.get("config") != config:
        raise FullDataError(
            not_prepared(store, full.domain, f"no {full.domain} splits for these settings were written")
        )
    key = f"{prefix}/{split}.jsonl"
    blob = store.read_bytes(key)
    actual = hashlib.sha256(blob).hexdigest()
    expected = manifest["splits"][split]["sha256"]
    if actual != expected:
        raise FullDataError(
            f"{store.uri_for(key)}: SHA-256 {actual}, the manifest says {expected}; the split was "
            "changed after preparation: delete the folder and prepare again"
        )
    return [json.loads(line) for line in blob.decode("utf-8").splitlines() if line.strip()]
