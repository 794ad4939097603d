"""Train workload: one weight phase of online RSFT (``python -m whale.workloads train ...``).

Reads the PhaseRequest (kind ``weight``) from ``layout.request_key``; trains from ``fromStep``
(checkpoint ``fromCheckpoint``, None = ``spec.model``) up to ``targetStep`` under the harness
``harness`` (a store key, None = the domain's h0); appends one ``WeightStepMetrics`` line per step;
checkpoints at ``saveSteps``, every ``rsft.checkpointEverySteps`` and at the end; keeps resume state
so a killed attempt continues from its last checkpoint with the same data order and optimiser
state; honours STOP and the adaptive ``stopRule``; writes ``WeightPhaseResult`` last.

Sampling: in-process (the transformers backend shares the trained model object: no sync needed)
or a vLLM server (``inference.backend`` openai/vllm, or auto with ``$WHALE_INFERENCE_URL``); then
each step's weights are published with :class:`whale.rsft.sync.VLLMReloadSync`, writing to
``$WHALE_SYNC_DIR`` (a volume the server reads, seen there as ``$WHALE_SYNC_SERVER_DIR``).
Loop and components: ``whale.rsft``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from whale import layout
from whale.protocol import PhaseKind, PhaseRequest, WeightPhaseResult
from whale.rsft import checkpoint as ckpt
from whale.rsft.config import RSFTConfig
from whale.rsft.phase import WeightPhase, WeightPhaseError, find_start, finish
from whale.spec import WhaleRunSpec
from whale.store import Store

log = logging.getLogger(__name__)

SYNC_DIR_ENV = "WHALE_SYNC_DIR"
SYNC_SERVER_DIR_ENV = "WHALE_SYNC_SERVER_DIR"


def main(store: Store, run: str, phase: str) -> None:
    run_train(store, run, phase)


def read_request(store: Store, run: str, phase: str) -> PhaseRequest:
    request = PhaseRequest.model_validate(store.read_json(layout.request_key(run, phase)))
    if request.kind is not PhaseKind.WEIGHT or request.weight is None:
        raise WeightPhaseError(
            f"{layout.request_key(run, phase)}: kind is {request.kind.value}, expected weight with `weight` args"
        )
    return request


def run_train(store: Store, run: str, phase: str, *, domain: Any = None) -> WeightPhaseResult:
    """The workload; ``domain`` may be injected (tests)."""
    request = read_request(store, run, phase)
    args = request.weight
    assert args is not None  # noqa: S101 - read_request checked it
    done = store.read_json_or_none(layout.result_key(run, phase))
    if done is not None:
        log.info("phase %s already has a result; nothing to do", phase)
        return WeightPhaseResult.model_validate(done)
    if ckpt.checkpoint_complete(store, run, args.target_step) and args.target_step > args.from_step:
        log.info("checkpoint at target step %d exists: phase %s is done", args.target_step, phase)
        return finish(store, run, phase, args.target_step, "target")

    spec = WhaleRunSpec.model_validate(request.spec)
    cfg = RSFTConfig.from_spec(spec, args)
    if domain is None:
        from whale import domains

        domain = domains.load(spec.domain)
    items = domain.load_split("weight", spec.data, store)
    if not items:
        raise WeightPhaseError(f"domain {spec.domain!r} has an empty weight split (D_weight); check spec.data")
    start = find_start(store, run, phase, args)

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    with tempfile.TemporaryDirectory(prefix="whale-train-") as tmp:
        model, tokenizer = load_for_training(store, spec, start.model_prefix, Path(tmp), device)
        from whale.rsft.trainer import SFTTrainer

        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        trainer = SFTTrainer(model, cfg, device=device, pad_id=int(pad_id))
        if start.optimizer_state is not None:
            trainer.load_optimizer_state(start.optimizer_state)
        harness_path = harness_file(store, args.harness, domain, Path(tmp))
        from whale.harness.validate import validate_file

        validate_file(harness_path, domain.allowed_imports)
        client, sync, lock = make_sampling_backend(spec, model, tokenizer)
        from whale.inference.factory import sampling_for
        from whale.rsft.sampling import HarnessSampler

        sampling = sampling_for(spec, temperature=spec.rsft.sampling.temperature)
        with HarnessSampler(domain, harness_path, client, sampling, max_concurrency=spec.inference.max_concurrency,
                            harness_label=args.harness or "h0") as sampler:
            loop = WeightPhase(store=store, run=run, phase=phase, args=args, cfg=cfg, items=items, model=model,
                               tokenizer=tokenizer, trainer=trainer, sampler=sampler, sync=sync, weights_lock=lock)
            result = loop.run_from(start)
    log.info("phase %s done: step %d, stopped by %s", phase, result.final_step, result.stopped_by)
    return result


def load_for_training(store: Store, spec: WhaleRunSpec, prefix: str | None, workdir: Path, device: Any):
    """(model, tokenizer) in fp32 (master weights) on ``device``: a store checkpoint or ``spec.model``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if prefix is not None:
        source, kwargs = str(ckpt.materialise(store, prefix, workdir)), {}
    else:
        source = spec.model.name
        kwargs = {"revision": spec.model.revision, "trust_remote_code": spec.model.trust_remote_code}
        if spec.model.gguf_file:
            kwargs["gguf_file"] = spec.model.gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    except (OSError, ValueError) as exc:
        raise WeightPhaseError(f"cannot load the model to train from {source!r}: {exc}") from exc
    if getattr(model.config, "quantization_config", None) is not None:  # GGUF: dequantised on load
        del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.use_cache = False
    return model.to(device), tokenizer


def harness_file(store: Store, key: str | None, domain: Any, tmp: Path) -> Path:
    """The harness to sample under: a store key, or the domain's h0."""
    if key is None:
        return domain.h0_path()
    local = store.local_path(key)
    if local is not None and Path(local).is_file():
        return Path(local)
    path = tmp / "harness.py"
    path.write_bytes(store.read_bytes(key))
    return path


def make_sampling_backend(spec: WhaleRunSpec, model: Any, tokenizer: Any):
    """(client, weight sync, weights lock): in-process sharing ``model``, or vLLM + reload sync."""
    from whale.inference.factory import backend_kind, inference_url, make_client
    from whale.rsft.sync import SharedModelSync, VLLMReloadSync

    if backend_kind(spec) == "http":
        sync_dir = os.environ.get(SYNC_DIR_ENV)
        if not sync_dir:
            raise WeightPhaseError(
                f"sampling goes to a vLLM server, so the new weights must reach it: set ${SYNC_DIR_ENV} to a "
                f"folder the server can read (and ${SYNC_SERVER_DIR_ENV} to its path there, if different)"
            )
        sync = VLLMReloadSync(inference_url(spec), Path(sync_dir), os.environ.get(SYNC_SERVER_DIR_ENV))
        return make_client(spec), sync, None
    from whale.inference.transformers_backend import TransformersClient

    client = TransformersClient(model, tokenizer, max_batch_size=spec.inference.max_concurrency,
                                model_name=spec.model.served_model_name or spec.model.name)
    return client, SharedModelSync(), client.lock
