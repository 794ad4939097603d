"""Where a WhaleRun's data lives on a shared cluster, and which stores the operator may touch at all.

A run's store is ``<spec.execution.storage.uri>/<namespace>/<name>.<uid>``: the namespace keeps tenants apart (two
namespaces with the same run name never share a phase, checkpoint or best score), the UID keeps a deleted
and re-created run from inheriting its predecessor's completed phases. ``spec.execution.resumeFrom: <uid>`` adopts the
store of an earlier WhaleRun of the same name in the same namespace (the UID its status showed in
``status.storeUri``); another namespace's data cannot be named at all.

The operator writes with credentials and calls whatever S3 endpoint a run names, so it only opens stores a platform
team allowed: ``WHALE_ALLOWED_S3_ENDPOINTS`` (comma-separated ``host:port``) is an allow-list that is ON by default:
unset or empty, no S3 endpoint is allowed (a run naming one is refused; ``*`` allows any, for a single-tenant
install). ``WHALE_ALLOWED_STORES`` (``s3://bucket[/prefix]`` or ``file:///path`` prefixes) narrows further; unset,
any store under an allowed endpoint. A WhaleRun outside either is refused with the field named before anything is
created. Pure: no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from whale_operator.cluster_spec import ClusterRunSpec

ALLOWED_STORES_ENV = "WHALE_ALLOWED_STORES"
ALLOWED_ENDPOINTS_ENV = "WHALE_ALLOWED_S3_ENDPOINTS"
#: in ``WHALE_ALLOWED_S3_ENDPOINTS``: every endpoint (the admin's explicit opt-out of the allow-list)
ANY_ENDPOINT = "*"


def run_store_uri(base_uri: str, namespace: str, name: str, uid: str, resume_from: str | None = None) -> str:
    """The store root of one WhaleRun object: ``<base>/<namespace>/<name>.<uid>``.

    ``resume_from`` (an earlier run's UID) replaces the UID: that run's store is adopted. Namespace and
    name come from the object, never from the spec, so a tenant can only name its own namespace's data."""
    if not namespace or not name or not uid:
        raise ValueError("a run's store needs its namespace, name and uid")
    return f"{base_uri.rstrip('/')}/{namespace}/{name}.{resume_from or uid}"


def scoped(spec: ClusterRunSpec, namespace: str, name: str, uid: str) -> ClusterRunSpec:
    """``spec`` with ``storage.uri`` replaced by the run's own store (:func:`run_store_uri`): what every child
    and the operator itself then read and write. The one place the operator decides where a run lives."""
    if spec.execution.storage.uri is None:
        raise ValueError("spec.execution.storage.uri: the operator needs an object store")
    uri = run_store_uri(spec.execution.storage.uri, namespace, name, uid, spec.execution.resume_from)
    return spec.with_sections(**{"storage": spec.execution.storage.model_copy(update={"uri": uri})})


def _split_list(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def _under(uri: str, prefix: str) -> bool:
    """``uri`` is ``prefix`` or below it, on a path boundary (``s3://a`` does not allow ``s3://ab``)."""
    uri, prefix = uri.rstrip("/"), prefix.rstrip("/")
    return uri == prefix or uri.startswith(prefix + "/")


@dataclass(frozen=True)
class StorePolicy:
    """The stores and S3 endpoints this operator may open on behalf of a WhaleRun. ``endpoints`` empty: none (the
    allow-list is on by default), ``("*",)``: any; ``stores`` empty: any under an allowed endpoint."""

    stores: tuple[str, ...] = ()
    endpoints: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StorePolicy:
        env = os.environ if env is None else env
        return cls(_split_list(env.get(ALLOWED_STORES_ENV)), _split_list(env.get(ALLOWED_ENDPOINTS_ENV)))

    def problems(self, uri: str | None, endpoint: str | None) -> list[tuple[str, str]]:
        """(field, message) for each way ``spec.execution.storage`` leaves what the platform team allowed."""
        out: list[tuple[str, str]] = []
        if self.stores and uri is not None and not any(_under(uri, allowed) for allowed in self.stores):
            out.append(
                (
                    "spec.execution.storage.uri",
                    f"{uri} is not a store this operator may use; allowed: "
                    f"{', '.join(self.stores)} (the operator's {ALLOWED_STORES_ENV}; ask the cluster's admins)",
                )
            )
        if endpoint is not None and ANY_ENDPOINT not in self.endpoints and _host_port(endpoint) not in self.endpoints:
            allowed = (
                f"allowed: {', '.join(self.endpoints)}"
                if self.endpoints
                else "none is allowed until the cluster's admins list theirs"
            )
            out.append(
                (
                    "spec.execution.storage.endpoint",
                    f"{endpoint} is not an S3 endpoint this operator may use; {allowed} (the operator's "
                    f"{ALLOWED_ENDPOINTS_ENV}, the chart's allowedS3Endpoints; ask the cluster's admins)",
                )
            )
        return out


def _host_port(endpoint: str) -> str:
    """``host:port`` of an endpoint given with or without its scheme (``http://minio:9000/`` -> ``minio:9000``)."""
    bare = endpoint.strip()
    for scheme in ("http://", "https://"):
        if bare.lower().startswith(scheme):
            bare = bare[len(scheme) :]
    return bare.rstrip("/")
