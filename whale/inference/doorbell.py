"""The weight-sync sidecar's doorbell: after each acknowledgement in the store (``control/served.json``) it
stamps the acknowledgement on the run's ConfigMap ``<run>-served``, which the operator watches.

The store stays the one record of what is served; a write there raises no Kubernetes event, so without the
doorbell a run that waits for the acknowledgement (to start a child that samples from new weights) would be
noticed only by the operator's progress poll. The annotation carries no authority: the operator only wakes the
run, which then reads ``served.json`` as before.

The sidecar is allowed exactly this: ``get`` and ``patch`` on that one ConfigMap (a Role the operator makes
per run), through a projected service-account token mounted into the sidecar only. A ring that fails is logged
and dropped: the acknowledgement is already in the store and the operator's poll still finds it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("whale.inference.doorbell")

#: where a pod's service-account token, CA and namespace are mounted (the projected volume uses the same path)
ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: the ConfigMap to stamp (set by the operator on the sidecar); unset: no doorbell (a local run, a test)
CONFIGMAP_ENV = "WHALE_SERVED_CONFIGMAP"
#: the annotation the acknowledgement is stamped in
ANNOTATION = "whale.dev/served"
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Doorbell:
    """Stamps acknowledgements on one ConfigMap through the Kubernetes API."""

    api_url: str
    namespace: str
    configmap: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None, account_dir: Path = ACCOUNT_DIR) -> Doorbell | None:
        """In a pod the operator gave the doorbell to; None elsewhere (nothing to ring)."""
        env = dict(os.environ) if env is None else env
        name, host = env.get(CONFIGMAP_ENV), env.get("KUBERNETES_SERVICE_HOST")
        token, namespace = account_dir / "token", account_dir / "namespace"
        if not name or not host or not token.is_file() or not namespace.is_file():
            return None
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        ca = account_dir / "ca.crt"
        return cls(f"https://{host}:{port}", namespace.read_text().strip(), name, token, ca if ca.is_file() else None)

    def ring(self, ack: dict[str, Any]) -> bool:
        """Stamp ``ack`` on the ConfigMap; False (logged) when the API server could not be told."""
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{self.configmap}"
        body = {"metadata": {"annotations": {ANNOTATION: json.dumps(ack, sort_keys=True)}}}
        headers = {"Content-Type": "application/merge-patch+json"}
        if self.token_file is not None:  # read each time: the kubelet rotates a projected token
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        try:
            with httpx.Client(base_url=self.api_url, verify=str(self.ca_file) if self.ca_file else True) as http:
                resp = http.patch(path, content=json.dumps(body), headers=headers, timeout=TIMEOUT_S)
        except (httpx.HTTPError, OSError) as exc:
            log.warning("could not ring the operator's doorbell (ConfigMap %s): %s", self.configmap, exc)
            return False
        if resp.status_code >= 300:
            log.warning(
                "the API server refused the doorbell (ConfigMap %s): HTTP %d %s",
                self.configmap,
                resp.status_code,
                resp.text[:200],
            )
            return False
        return True
