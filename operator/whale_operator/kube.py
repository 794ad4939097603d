"""The operator's one Kubernetes client: plain dicts in, plain dicts out.

The only module that imports the ``kubernetes`` SDK. It speaks the REST API directly (generic
paths per kind) so builders' dicts go to the server unchanged and come back as dicts; typed errors
carry retry meaning (:class:`Conflict` when a name is taken by an object being deleted: try again
soon; :class:`Refused` for a 4xx that says the request itself is wrong or not allowed: a human must act).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from whale.core.spec import API_GROUP, API_VERSION, PLURAL
from whale_operator.transport import Transport

log = logging.getLogger(__name__)

#: (apiVersion, kind) -> plural; all namespaced
PLURALS: dict[tuple[str, str], str] = {
    ("batch/v1", "Job"): "jobs",
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("v1", "Secret"): "secrets",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): "resourceclaimtemplates",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobsets",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "podgroups",
    ("kueue.x-k8s.io/v1beta1", "Workload"): "workloads",  # read only: why Kueue holds or evicted a child
    (f"{API_GROUP}/{API_VERSION}", "WhaleRun"): PLURAL,
}
REQUEST_TIMEOUT_S = 30
_TIMEOUT = urllib3.Timeout(total=REQUEST_TIMEOUT_S)
#: a kubeconfig's credentials are reloaded at most this often (the SDK reloads them before every request, a fifth
#: of a request's CPU; the in-cluster loader already reloads its token once a minute)
TOKEN_REFRESH_S = 30.0


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message
        super().__init__(f"HTTP {status}: {message}")


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """The name is taken by an object that is being deleted: temporary."""


class Refused(KubeError):
    """The API server refused the request for good as it stands (a 4xx other than 404/409/429: forbidden by
    RBAC or admission, invalid): retrying the same request at once cannot help, a human must act."""


#: 4xx statuses that say "try again later", not "this request is wrong"
_TRANSIENT_4XX = frozenset({408, 429})


def _at_most_every(seconds: float, hook: Any) -> Any:
    """``hook(configuration)`` called at most once per ``seconds`` (the first call always). The kubeconfig loader's
    hook installs a new hook of its own each time it runs (kubernetes.config.kube_config ``_set_config``): the
    throttle takes that one and stays in front, or every request after the first would reload the credentials
    (a fifth of a reconcile's CPU: ``_set_config`` sets ``host``, which reads every proxy variable of the
    environment)."""
    last = [float("-inf")]
    current = [hook]

    def throttled(configuration: Any) -> None:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            current[0](configuration)
            if configuration.refresh_api_key_hook is not throttled:
                current[0] = configuration.refresh_api_key_hook
                configuration.refresh_api_key_hook = throttled

    return throttled


def _api_base(api_version: str) -> str:
    """The core group's ``/api/v1``, any other group's ``/apis/<group>/<version>``."""
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    return f"{_api_base(api_version)}/namespaces/{quote(namespace)}/{PLURALS[(api_version, kind)]}"


def watch_path(api_version: str, kind: str, namespace: str | None) -> str:
    """The collection of one namespace, or of every namespace (``None``): what a watch lists and watches."""
    if namespace is not None:
        return collection_path(api_version, kind, namespace)
    return f"{_api_base(api_version)}/{PLURALS[(api_version, kind)]}"


#: the longest line a stream takes (a watch event: one object, at most etcd's 1.5 MiB, in JSON)
MAX_LINE_BYTES = 16 * 2**20


class Stream:
    """One streamed answer (a watch): its lines as they come, closable from another thread (the read blocked in
    :meth:`lines` then ends at once: an operator stopping does not wait out the watch's timeout)."""

    def __init__(self, resp: Any):
        self._resp = resp

    def lines(self) -> Iterator[bytes]:
        """Each non-empty line, as soon as the server sent it whole (a line's start is split only once its end came:
        a long line costs its length, not its length times its chunks)."""
        pending = bytearray()
        while True:
            chunk = self._resp.read1(65536)
            if not chunk:
                return
            head, newline, tail = chunk.rpartition(b"\n")
            if newline:
                pending += head
                whole = bytes(pending).split(b"\n")
                pending = bytearray(tail)
                yield from (line for line in whole if line.strip())
            else:
                pending += tail
            if len(pending) > MAX_LINE_BYTES:
                raise KubeError(502, f"a streamed line longer than {MAX_LINE_BYTES} bytes")

    def shutdown(self) -> None:
        """End a read blocked in :meth:`lines` (from another thread): the socket takes no more input."""
        try:
            self._resp.shutdown()
        except (ValueError, RuntimeError, OSError):  # closed already
            pass

    def close(self) -> None:
        """Close the connection (the reading thread): the pool gets it back closed, never half-read."""
        self._resp.close()
        self._resp.release_conn()


def _message(data: bytes) -> str:
    """The message of an API server's refusal (its Status object), or the start of whatever else it answered."""
    try:
        return str(json.loads(data).get("message", ""))
    except (ValueError, AttributeError):
        return data[:200].decode("utf-8", "replace")


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{quote(name)}"


@dataclass
class KubeClient:
    """A thin synchronous client (kopf runs it in worker threads)."""

    api: k8s_client.ApiClient
    #: called with every object the API server answers a create or a patch with, and with the object a create found
    #: in its place (the operator's informer keeps its copy current with the operator's own writes:
    #: :mod:`whale_operator.informer`)
    on_write: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False)
    #: per thread, how many requests that change something were sent (:meth:`writes`)
    _local: threading.local = field(default_factory=threading.local, init=False, repr=False)
    #: the streams' own connections (:meth:`stream`): a watch holds one for minutes, never one the reconciles need
    _streams: Any = field(default=None, init=False, repr=False)
    _streams_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    #: per thread, one kept-open connection to the API server, made with the settings of the SDK's pool for it
    #: (:mod:`whale_operator.transport`); None through an HTTP proxy (urllib3 writes the requests for it)
    _transport: Transport | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        cfg, manager = self.api.configuration, self.api.rest_client.pool_manager
        if not isinstance(manager, urllib3.ProxyManager):
            url = urlsplit(cfg.host)
            pool = manager.connection_from_url(cfg.host)
            self._transport = Transport(pool, url.path, url.netloc.rpartition("@")[2], REQUEST_TIMEOUT_S)

    def writes(self) -> int:
        """Requests other than GET sent by this thread so far: a reconcile that sent none changed nothing here."""
        return int(getattr(self._local, "writes", 0))

    @classmethod
    def from_environment(cls, pool_size: int | None = None) -> KubeClient:
        """In-cluster service account, else $KUBECONFIG / ~/.kube/config; ``pool_size`` connections kept open
        (the operator: one per worker thread; the SDK's default, 5 per CPU, leaves threads opening and discarding
        connections). Set before the API client exists: its pool is built with it and never reads it again."""
        cfg = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except k8s_config.ConfigException:
            # read $KUBECONFIG now: the SDK reads it once, at import time
            k8s_config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg)
        if pool_size is not None:
            cfg.connection_pool_maxsize = pool_size
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook = _at_most_every(TOKEN_REFRESH_S, cfg.refresh_api_key_hook)
        return cls(k8s_client.ApiClient(cfg))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self.api.close()
        if self._streams is not None:
            self._streams.clear()

    # --- transport ---
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        # not through the SDK's call path (it re-serialises every body and rebuilds every request, twice the CPU of the
        # request itself): on this thread's own connection (its TLS as the SDK's configuration asks), or through
        # urllib3 to an HTTP proxy
        if method != "GET":
            self._local.writes = self.writes() + 1
        cfg = self.api.configuration
        headers = self._headers({"Content-Type": content_type})
        target = path + (f"?{urlencode(query)}" if query else "")
        payload = None if body is None else json.dumps(body).encode()
        if self._transport is not None:
            status, data = self._transport.request(method, target, headers, payload)
        else:  # through a proxy: the manager writes the request for it
            resp = self.api.rest_client.pool_manager.request(
                method, cfg.host + target, body=payload, headers=headers, timeout=_TIMEOUT
            )
            status, data = resp.status, resp.data
        data = data or b"{}"
        if 200 <= status < 300:
            answer = json.loads(data)
            if self.on_write is not None and method in ("POST", "PATCH", "PUT") and isinstance(answer, dict):
                self.on_write(answer)
            return answer
        message = _message(data)
        if status == 404:
            raise NotFound(status, message)
        if status == 409:
            raise Conflict(status, message)
        if 400 <= status < 500 and status not in _TRANSIENT_4XX:
            raise Refused(status, message)
        raise KubeError(status, message)

    def stream(self, path: str, query: dict[str, str], read_timeout_s: float) -> Stream:
        """A streamed GET (a watch), through a pool manager of its own built by the SDK from the same configuration
        (TLS, client certificate, proxy; the bearer token as :meth:`request` sends it). A read that waits longer than
        ``read_timeout_s`` for a byte raises; a non-2xx answer raises :class:`NotFound` (404) or :class:`KubeError`."""
        cfg = self.api.configuration
        with self._streams_lock:
            if self._streams is None:
                self._streams = k8s_client.rest.RESTClientObject(cfg).pool_manager
        headers = self._headers({})
        resp = self._streams.request(
            "GET",
            f"{cfg.host}{path}?{urlencode(query)}",
            headers=headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=REQUEST_TIMEOUT_S, read=read_timeout_s),
        )
        if 200 <= resp.status < 300:
            return Stream(resp)
        data = resp.read()
        resp.release_conn()
        raise (NotFound if resp.status == 404 else KubeError)(resp.status, _message(data))

    def _headers(self, extra: dict[str, str]) -> dict[str, str]:
        """A request's headers: the SDK's defaults, JSON, ``extra``, and the bearer token (refreshed by the
        configuration's hook)."""
        headers = {**self.api.default_headers, "Accept": "application/json", **extra}
        for auth in self.api.configuration.auth_settings().values():
            if auth["in"] == "header" and auth["value"]:
                headers[auth["key"]] = auth["value"]
        return headers

    # --- objects ---
    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", object_path(api_version, kind, namespace, name))
        except NotFound:
            return None

    def list(self, api_version: str, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": selector} if selector else None
        return list(self.request("GET", collection_path(api_version, kind, namespace), query=query).get("items", []))

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret ``name`` (``data`` base64 as the API returns it), None when it does not exist; a
        :class:`Refused` (403) when the operator may not read it."""
        return self.get("v1", "Secret", namespace, name)

    def json_patch(self, api_version: str, kind: str, namespace: str, name: str, ops: Sequence[dict[str, Any]]) -> Any:
        """RFC 6902 (``replace`` drops what the new value leaves out, which a merge patch would keep)."""
        return self.request(
            "PATCH",
            object_path(api_version, kind, namespace, name),
            body=ops,
            content_type="application/json-patch+json",
        )

    def ensure(self, manifest: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create unless it exists (deterministic names make this idempotent); (object, created)."""
        meta = manifest["metadata"]
        path = collection_path(manifest["apiVersion"], manifest["kind"], meta["namespace"])
        try:
            return self.request("POST", path, body=manifest), True
        except Conflict:
            existing = self.get(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
            if existing is None or existing.get("metadata", {}).get("deletionTimestamp"):
                raise Conflict(409, f"{manifest['kind']} {meta['name']} is being deleted; will retry") from None
            if self.on_write is not None:
                self.on_write(existing)  # what the create found in its place
            return existing, False

    def merge_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        path = object_path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (the garbage collector removes the pods); False if absent."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self.request("DELETE", object_path(api_version, kind, namespace, name), body=body)
        except NotFound:
            return False
        return True

    def has_api(self, group_version: str) -> bool:
        """The API server serves ``group/version`` (discovery; e.g. a CRD's API is installed)."""
        try:
            self.request("GET", f"/apis/{group_version}")
        except NotFound:
            return False
        return True

    # --- WhaleRun ---
    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(f"{API_GROUP}/{API_VERSION}", "WhaleRun", namespace, name)

    def patch_run_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.merge_patch(
            f"{API_GROUP}/{API_VERSION}", "WhaleRun", namespace, name, {"status": status}, subresource="status"
        )
