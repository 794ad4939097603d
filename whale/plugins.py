"""The domain registry: domains are plugins found through the ``whale.domains`` entry-point group.

Listing names reads only package metadata (fast, no imports), so ``whale validate`` can reject an
unknown domain without importing torch or chess. Loading a domain imports its package.
"""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from whale.domain import Domain

ENTRY_POINT_GROUP = "whale.domains"
log = logging.getLogger(__name__)


class UnknownDomainError(LookupError):
    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(
            f"unknown domain {name!r}; registered domains: {', '.join(known) or '(none)'} "
            f"(a domain registers under the entry-point group {ENTRY_POINT_GROUP!r})"
        )


class DomainLoadError(ImportError):
    """A registered domain whose package fails to import: reported with the cause, never dropped."""


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    return sorted(_entry_points())


def load(name: str) -> Domain:
    eps = _entry_points()
    if name not in eps:
        raise UnknownDomainError(name, sorted(eps))
    try:
        obj = eps[name].load()
    except Exception as exc:  # re-raised typed, with the cause chained
        log.exception("domain %s failed to load", name)
        raise DomainLoadError(f"domain {name!r} is registered but failed to import: {exc}") from exc
    return obj() if isinstance(obj, type) else obj
