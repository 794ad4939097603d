"""Where a Hugging Face model id can be loaded from on this machine: the local Hugging Face cache, the Hub (a
probe bounded by :data:`PROBE_TIMEOUT_S`), or neither. `whale validate` and `whale run` say which before any
phase starts: a model that cannot be loaded used to fail only when the first phase loaded it, after its retries.

The cache and the endpoint are Hugging Face's own settings, read when asked (``HF_HUB_CACHE``, else
``HF_HOME``/hub, else ``~/.cache/huggingface/hub``; ``HF_ENDPOINT``; ``HF_HUB_OFFLINE``; ``HF_TOKEN``).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import threading
from collections.abc import Mapping
from pathlib import Path

#: seconds the Hub has to answer (name resolution included) before it counts as unreachable
PROBE_TIMEOUT_S = 5.0
DEFAULT_ENDPOINT = "https://huggingface.co"


class Origin(str, enum.Enum):
    CACHED = "cached"  # in the local cache: loads offline
    HUB = "hub"  # not cached; the Hub has it: the first phase downloads it
    ABSENT = "absent"  # not cached; the Hub answered that it has no such model this machine may read
    UNREACHABLE = "unreachable"  # not cached; the Hub did not answer (or HF_HUB_OFFLINE is set)
    UNCHECKED = "unchecked"  # huggingface_hub is not installed here


@dataclasses.dataclass(frozen=True)
class Location:
    model: str
    origin: Origin
    #: the cached file, the endpoint, or why not
    detail: str

    def problem(self) -> str | None:
        """The problem that stops a run here (field and fix), or None when the model can be loaded."""
        if self.origin is Origin.ABSENT:
            return (
                f"spec.experiment.model.name: {self.model} is not in the local Hugging Face cache and {self.detail}; check "
                "the id (org/name), set HF_TOKEN for a gated or private model, or give a local model folder"
            )
        if self.origin is Origin.UNREACHABLE:
            return (
                f"spec.experiment.model.name: {self.model} is not in the local Hugging Face cache and {self.detail}; "
                f"download it first where the Hub is reachable (`hf download {self.model}`, into the same cache), "
                "point HF_HUB_CACHE at a cache that has it, or give a local model folder"
            )
        return None

    def note(self) -> str:
        """One line saying where the model loads from."""
        if self.origin is Origin.CACHED:
            return f"model {self.model}: in the local Hugging Face cache ({self.detail})"
        if self.origin is Origin.HUB:
            return f"model {self.model}: not cached; {self.detail} has it, the first phase downloads it"
        if self.origin is Origin.UNCHECKED:
            return f"model {self.model}: not checked ({self.detail})"
        return self.problem() or ""


@dataclasses.dataclass(frozen=True)
class Settings:
    cache_dir: Path
    endpoint: str
    offline: bool
    token: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        home = Path(environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
        return cls(
            cache_dir=Path(environ.get("HF_HUB_CACHE") or home / "hub"),
            endpoint=(environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            offline=environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"),
            token=environ.get("HF_TOKEN") or None,
        )


def cache_lookup(cache_dir: Path, model: str, filename: str, revision: str | None = None) -> Path | None:
    """``filename`` of model ``model`` at ``revision`` (a branch, tag or commit; None: main) in the Hugging Face
    cache ``cache_dir``, or None: what ``huggingface_hub.try_to_load_from_cache`` answers for a file that is
    there, read from the cache's documented layout (``models--ORG--NAME/refs/REV`` -> ``snapshots/SHA/FILE``)
    without importing huggingface_hub, which costs `whale validate` more than the rest of its start-up
    (tests/unit/test_hub_cache.py holds the two to the same answers)."""
    repo = cache_dir / f"models--{model.replace('/', '--')}"
    rev = revision or "main"
    ref = repo / "refs" / rev
    if ref.is_file():
        rev = ref.read_text()
    found = repo / "snapshots" / rev / filename
    return found if found.is_file() else None


def cached(
    model: str, environ: Mapping[str, str], *, revision: str | None = None, filename: str = "config.json"
) -> Path | None:
    """``filename`` of ``model`` in the local Hugging Face cache (no network), or None."""
    if importlib.util.find_spec("huggingface_hub") is None:
        return None
    return cache_lookup(Settings.from_env(environ).cache_dir, model, filename, revision)


def locate(
    model: str,
    environ: Mapping[str, str],
    *,
    revision: str | None = None,
    filename: str = "config.json",
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Location:
    """Where ``model`` (an ``org/name`` id) loads from: its ``filename`` in the cache, else the Hub's answer."""
    if importlib.util.find_spec("huggingface_hub") is None:
        return Location(model, Origin.UNCHECKED, "huggingface_hub is not installed")
    settings = Settings.from_env(environ)
    found = cache_lookup(settings.cache_dir, model, filename, revision)
    if found is not None:
        return Location(model, Origin.CACHED, str(found))
    if settings.offline:
        return Location(model, Origin.UNREACHABLE, "HF_HUB_OFFLINE is set")
    return _probe(model, revision, settings, timeout_s)


def _probe(model: str, revision: str | None, settings: Settings, timeout_s: float) -> Location:
    """Ask the Hub's model API, in a thread, so that a hanging name lookup cannot hold the caller past the
    deadline (httpx's timeouts do not cover ``getaddrinfo``)."""
    import httpx

    url = f"{settings.endpoint}/api/models/{model}" + (f"/revision/{revision}" if revision else "")
    headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
    answer: list[Location] = []

    def ask() -> None:
        try:
            status = httpx.get(url, headers=headers, timeout=timeout_s, follow_redirects=True).status_code
        except httpx.HTTPError as exc:
            answer.append(Location(model, Origin.UNREACHABLE, f"{settings.endpoint} is unreachable ({exc})"))
            return
        if status == 200:
            answer.append(Location(model, Origin.HUB, settings.endpoint))
        elif status in (401, 403, 404):
            answer.append(Location(model, Origin.ABSENT, f"{url} answered HTTP {status} (no such model to read)"))
        else:
            answer.append(Location(model, Origin.UNREACHABLE, f"{url} answered HTTP {status}"))

    worker = threading.Thread(target=ask, name="whale-hub-probe", daemon=True)
    worker.start()
    worker.join(timeout_s + 1.0)
    if not answer:
        return Location(model, Origin.UNREACHABLE, f"{settings.endpoint} did not answer within {timeout_s:g} s")
    return answer[0]
