"""Each run's store, opened with the run's OWN credentials: the Secret its spec names
(``spec.execution.storage.credentialsSecret``, in the run's namespace), read through the Kubernetes API.

On a shared cluster the operator must not reach a tenant's store with credentials of its own: a tenant would then
read and write whatever the operator's key may (another team's bucket). So a run's store is opened with the keys
the run's own Secret holds (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, optionally ``AWS_SESSION_TOKEN``:
the same Secret its Jobs get through ``envFrom``), and nothing of the operator's environment. A run that names
no Secret is opened with the operator's own credentials only where the platform team allowed it
(``WHALE_OPERATOR_OWN_STORE_CREDENTIALS``, see :class:`whale_operator.config.OperatorConfig`); a folder store
(``file://``) needs none.

A Secret that is missing, lacks a key or may not be read makes the run WAIT (:class:`CredentialsUnavailable`,
shown in status naming the field, the Secret and the fix), not fail: a Secret applied after its WhaleRun
(``kubectl apply -f dir/`` has no order) is the common case, and the run starts the moment it appears. A Secret read
is used for ``recheck_s`` (``WHALE_OPERATOR_SECRET_RECHECK_S``, 30 s) before it is read again, not read at every
reconcile (a request to the API server each, for runs that reconcile every few seconds); a rotated Secret is picked up
then, or at once when the store refuses the keys held (:meth:`RunStores.forget_credentials`): stores are cached per
(namespace, Secret, resourceVersion).
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whale.control.storage import open_spec_store
from whale.store import Store
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.kube import KubeClient, Refused

FIELD = "spec.execution.storage.credentialsSecret"
ACCESS_KEY = "AWS_ACCESS_KEY_ID"
SECRET_KEY = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN = "AWS_SESSION_TOKEN"


class CredentialsUnavailable(RuntimeError):
    """The run's credentials Secret cannot be used yet (missing, incomplete, not readable): the run waits. The
    message names ``spec.execution.storage.credentialsSecret``, the Secret and the fix."""


@dataclass(frozen=True)
class StoreCredentials:
    """Keys from one run's Secret; never printed (``repr`` hides them)."""

    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def store_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"access_key": self.access_key, "secret_key": self.secret_key}
        if self.session_token:
            opts["session_token"] = self.session_token
        return opts


def secret_values(secret: dict[str, Any]) -> dict[str, str]:
    """A Secret's keys as text: ``data`` (base64, what the API returns) over ``stringData``."""
    out = {k: str(v) for k, v in (secret.get("stringData") or {}).items()}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            continue  # a key that is not base64 text is as good as missing: the caller names it
    return out


def credentials_from_secret(secret: dict[str, Any], where: str) -> StoreCredentials:
    """The store keys of ``secret``; :class:`CredentialsUnavailable` naming each missing key. Pure."""
    values = secret_values(secret)
    missing = [k for k in (ACCESS_KEY, SECRET_KEY) if not values.get(k)]
    if missing:
        raise CredentialsUnavailable(
            f"{FIELD}: Secret {where} has no {' or '.join(missing)}; add "
            f"{' and '.join(missing)} to it (the keys of the run's object store)"
        )
    return StoreCredentials(values[ACCESS_KEY], values[SECRET_KEY], values.get(SESSION_TOKEN) or None)


def _cache_key(namespace: str, spec: ClusterRunSpec) -> tuple[str, str, str | None, bool, str | None, str | None]:
    s = spec.execution.storage
    return (namespace, s.uri or "", s.endpoint, s.secure, s.region, s.credentials_secret)


class RunStores:
    """The stores of every run this operator serves, each opened with that run's credentials.

    ``own_options``: the operator's own store options (credentials from its environment), used only for a run that
    names no Secret (the caller has checked that this is allowed). ``bounds``: options that bound every call of an
    s3:// store (timeouts, retry deadline; :class:`whale_operator.config.StoreBounds`). ``recheck_s``: how long a
    Secret read is used before it is read again (``clock``: monotonic seconds)."""

    def __init__(
        self,
        kube: KubeClient,
        own_options: dict[str, Any] | None = None,
        bounds: dict[str, Any] | None = None,
        recheck_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.kube = kube
        self.own_options = dict(own_options or {})
        self.bounds = dict(bounds or {})
        self.recheck_s = recheck_s
        self.clock = clock
        self._lock = threading.Lock()
        #: (namespace, uri, endpoint, secure, region, secret) -> (the Secret's resourceVersion, the store)
        self._stores: dict[tuple[Any, ...], tuple[str | None, Store]] = {}
        #: (namespace, Secret) -> (when it was read, its resourceVersion, its keys): a usable Secret, as last read
        self._secrets: dict[tuple[str, str], tuple[float, str | None, StoreCredentials]] = {}

    def forget_credentials(self, namespace: str, secret_name: str) -> None:
        """The store refused the keys held for this Secret: the next reconcile reads it again."""
        with self._lock:
            self._secrets.pop((namespace, secret_name), None)

    def credentials(self, namespace: str, secret_name: str) -> tuple[str | None, StoreCredentials]:
        """(resourceVersion, keys) of the run's Secret: as read within the last ``recheck_s``, else read now. Only a
        usable Secret is held: one missing or incomplete is read again at each call, so the run starts once it is
        fixed."""
        now = self.clock()
        with self._lock:
            held = self._secrets.get((namespace, secret_name))
        if held is not None and now - held[0] < self.recheck_s:
            return held[1], held[2]
        version, creds = self._read_credentials(namespace, secret_name)
        with self._lock:
            self._secrets[(namespace, secret_name)] = (now, version, creds)
        return version, creds

    def _read_credentials(self, namespace: str, secret_name: str) -> tuple[str | None, StoreCredentials]:
        """(resourceVersion, keys) of the run's Secret, read now."""
        where = f"{namespace}/{secret_name}"
        try:
            secret = self.kube.read_secret(namespace, secret_name)
        except Refused as exc:
            raise CredentialsUnavailable(
                f"{FIELD}: the operator may not read Secret {where} ({exc}); grant its "
                "ServiceAccount `get` on secrets in this namespace (docs/operator.md#store-credentials)"
            ) from None
        if secret is None:
            raise CredentialsUnavailable(
                f"{FIELD}: Secret {where} does not exist; create it with the keys {ACCESS_KEY} and {SECRET_KEY} "
                "(the run starts as soon as it exists)"
            )
        return secret.get("metadata", {}).get("resourceVersion"), credentials_from_secret(secret, where)

    def open(self, namespace: str, spec: ClusterRunSpec) -> Store:
        """The run's store (``spec`` already scoped to the run), opened with the run's own credentials."""
        key = _cache_key(namespace, spec)
        secret_name = spec.execution.storage.credentials_secret
        if secret_name is None:
            with self._lock:
                if key not in self._stores:
                    self._stores[key] = (
                        None,
                        open_spec_store(spec.execution.storage, **self.own_options, **self.bounds),
                    )
                return self._stores[key][1]
        version, creds = self.credentials(namespace, secret_name)
        with self._lock:
            cached = self._stores.get(key)
            if cached is not None and cached[0] == version:
                return cached[1]
        uri = spec.execution.storage.uri or ""
        # NOTE: env={} so nothing of the operator's own environment (its AWS_* keys) ever reaches a run's store
        store = (
            open_spec_store(spec.execution.storage, **creds.store_options(), **self.bounds, env={})
            if uri.startswith("s3://")
            else None
        )
        if store is None:
            store = open_spec_store(spec.execution.storage)  # a folder store: the Secret exists, no keys are used
        with self._lock:
            self._stores[key] = (version, store)  # a rotated Secret replaces the store of its old version
        return store
