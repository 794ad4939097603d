"""Pick and build the inference client a workload uses, from the run spec.

``spec.execution.inference.backend``:

* ``openai`` / ``vllm`` — HTTP to an OpenAI-compatible server at ``spec.execution.inference.baseUrl``, else
  ``$WHALE_INFERENCE_URL`` (the operator sets it on Jobs to the vLLM Service). The controller points
  that server at the right checkpoint (weight sync); the client asks ``/v1/models`` for the name.
* ``transformers`` — in-process: loads the checkpoint (a store prefix, downloaded when the store is
  remote) or ``spec.experiment.model`` (``name`` + optional ``ggufFile``).
* ``auto`` — HTTP when ``$WHALE_INFERENCE_URL`` is set (a cluster), else in-process (``whale run``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.inference.base import InferenceClient, InferenceError, SamplingParams

if TYPE_CHECKING:
    from whale.core.spec import WhaleRunSpec
    from whale.store import Store

INFERENCE_URL_ENV = "WHALE_INFERENCE_URL"


def backend_kind(spec: WhaleRunSpec, environ: dict[str, str] | None = None) -> str:
    """'http' or 'in-process' for this spec and environment. Pure."""
    env = os.environ if environ is None else environ
    backend = spec.execution.inference.backend
    if backend in ("openai", "vllm"):
        return "http"
    if backend == "transformers":
        return "in-process"
    return "http" if env.get(INFERENCE_URL_ENV) else "in-process"


def inference_url(spec: WhaleRunSpec, environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    url = spec.execution.inference.base_url or env.get(INFERENCE_URL_ENV)
    if not url:
        raise InferenceError(
            f"inference.backend is {spec.execution.inference.backend!r} but no server is given: set spec.execution.inference.baseUrl "
            f"or ${INFERENCE_URL_ENV} to an OpenAI-compatible endpoint (http://host:port/v1)"
        )
    return url


def checkpoint_dir(store: Store, prefix: str) -> Path:
    """A local folder holding the checkpoint at store ``prefix`` (the store's own path when local)."""
    local = store.local_path(prefix.rstrip("/"))
    if local is not None and Path(local).is_dir():
        return Path(local)
    return store.download_dir(prefix, Path(tempfile.mkdtemp(prefix="whale-ckpt-")))


def make_client(
    spec: WhaleRunSpec,
    store: Store | None = None,
    checkpoint: str | None = None,
    environ: dict[str, str] | None = None,
    **kwargs: Any,
) -> InferenceClient:
    """The client for this spec; ``checkpoint`` (a store prefix) overrides ``spec.experiment.model`` in-process."""
    if backend_kind(spec, environ) == "http":
        from whale.inference.openai_http import OpenAIClient
        from whale.inference.vllm_control import api_key_from_env

        return OpenAIClient(
            inference_url(spec, environ),
            # the run's own vLLM server's --api-key (set in the operator's pods; none in `whale run`), never sent to
            # an endpoint the spec names itself (spec.execution.inference.baseUrl)
            api_key=None if spec.execution.inference.base_url else api_key_from_env(environ),
            model=spec.experiment.model.served_model_name,
            timeout_s=float(spec.execution.inference.request_timeout_seconds),
            max_connections=max(16, spec.execution.inference.max_concurrency),
            max_model_len=spec.experiment.model.max_model_len,
        )
    from whale.inference.transformers_backend import TransformersClient

    if checkpoint is not None:
        if store is None:
            raise ValueError("a checkpoint prefix needs the store it lives in")
        path = checkpoint_dir(store, checkpoint)
        return TransformersClient.from_pretrained(
            str(path), model_name=checkpoint, max_model_len=spec.experiment.model.max_model_len, **kwargs
        )
    return TransformersClient.from_pretrained(
        spec.experiment.model.name,
        gguf_file=spec.experiment.model.gguf_file,
        revision=spec.experiment.model.revision,
        trust_remote_code=spec.experiment.model.trust_remote_code,
        model_name=spec.experiment.model.served_model_name or spec.experiment.model.name,
        max_model_len=spec.experiment.model.max_model_len,
        **kwargs,
    )


def chat_template_kwargs(spec: WhaleRunSpec) -> dict[str, Any]:
    """The chat-template variables every request of this run carries (``model.enableThinking``)."""
    return {"enable_thinking": spec.experiment.model.enable_thinking}


def sampling_for(spec: WhaleRunSpec, temperature: float | None = None) -> SamplingParams:
    """``spec.experiment.rsft.sampling`` (top_p, top_k, max tokens per call, the episode's token budget and
    window) with the run's chat-template variables, at ``temperature`` when given."""
    return SamplingParams.from_spec(
        spec.experiment.rsft.sampling, temperature=temperature, chat_template_kwargs=chat_template_kwargs(spec)
    )
