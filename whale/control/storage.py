"""The one translation of ``spec.execution.storage`` into a store connection: for a process that opens the
store itself (the CLI, the operator) and for a child that opens it from its environment (a Job).
Credentials never come from the spec: the process's environment or the Secret the spec names."""

from __future__ import annotations

from typing import Any

from whale.core.spec import Storage
from whale.store import Store, open_store

#: the variables ``whale.store.s3`` reads (named here so a builder need not import the S3 client)
ENV_ENDPOINT = "WHALE_S3_ENDPOINT"
ENV_SECURE = "WHALE_S3_SECURE"
ENV_REGION = "WHALE_S3_REGION"


def connection(storage: Storage, uri: str | None = None) -> dict[str, Any]:
    """Keyword options of ``open_store`` for ``uri`` (default: ``storage.uri``) under ``storage``'s
    endpoint, TLS and region; none for a folder store."""
    uri = uri or storage.uri or ""
    if not uri.startswith("s3://"):
        return {}
    options: dict[str, Any] = {"secure": storage.secure}
    if storage.endpoint:
        options["endpoint"] = storage.endpoint
    if storage.region:
        options["region"] = storage.region
    return options


def open_spec_store(storage: Storage, uri: str | None = None, **extra: Any) -> Store:
    """The store ``uri`` (default: ``storage.uri``) opened with :func:`connection`'s options plus
    ``extra`` (the operator's own credentials)."""
    target = uri or storage.uri
    if not target:
        raise ValueError("spec.execution.storage.uri: no store given; set it (or pass --store)")
    options = connection(storage, target)
    return open_store(target, **({**options, **extra} if options else {}))


def connection_env(storage: Storage) -> dict[str, str]:
    """The same connection as environment variables, for a child given ``--store`` (``whale.store.s3``
    reads them)."""
    env: dict[str, str] = {}
    if storage.endpoint:
        env[ENV_ENDPOINT] = storage.endpoint
    env[ENV_SECURE] = "true" if storage.secure else "false"
    if storage.region:
        env[ENV_REGION] = storage.region
    return env
