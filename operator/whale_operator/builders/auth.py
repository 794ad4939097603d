"""The run's own Secret (``<run>-auth``): the vLLM server's API key and the harness host's caller token, and the
environment entries that hand each pod only the key it needs.
"""

from __future__ import annotations

from typing import Any

from whale_operator import names
from whale_operator.builders.pods import Manifest, RunRef

# ----- the run's auth Secret ----------------------------------------------------------------------------

#: keys of the run's auth Secret (``names.auth_secret_name``): the vLLM server's ``--api-key`` and the harness
#: host's caller token; each pod gets only the key it needs, through ``secretKeyRef``
AUTH_VLLM_API_KEY = "vllm-api-key"
AUTH_HARNESS_TOKEN = "harness-token"
AUTH_SECRET_KEYS = (AUTH_VLLM_API_KEY, AUTH_HARNESS_TOKEN)
#: what clients of the run's vLLM server read the key from (``whale.inference.vllm_control.API_KEY_ENV``)
INFERENCE_API_KEY_ENV = "WHALE_INFERENCE_API_KEY"


def auth_secret(run: RunRef, values: dict[str, str]) -> Manifest:
    """The run's own Secret: made once by the operator with freshly generated ``values`` (never rotated, never
    overwritten), owned by the WhaleRun so it goes with it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": run.metadata(names.auth_secret_name(run.name), names.child_labels(run.name, "auth")),
        "type": "Opaque",
        "stringData": dict(values),
    }


def auth_key_env(run: RunRef, env_name: str, key: str) -> dict[str, Any]:
    """One key of the run's auth Secret as an environment variable (the value never enters a manifest)."""
    return {"name": env_name, "valueFrom": {"secretKeyRef": {"name": names.auth_secret_name(run.name), "key": key}}}


def inference_api_key_env(run: RunRef) -> dict[str, Any]:
    """``$WHALE_INFERENCE_API_KEY`` for a client of the run's vLLM server."""
    return auth_key_env(run, INFERENCE_API_KEY_ENV, AUTH_VLLM_API_KEY)
