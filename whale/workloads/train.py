"""Train workload: one weight phase of online RSFT (``python -m whale.workloads train ...``).

Reads the PhaseRequest (kind ``weight``) from ``layout.request_key``; trains from ``fromStep``
(checkpoint ``fromCheckpoint``, None = ``spec.experiment.model``) up to ``targetStep`` under the harness
``harness`` (a store key, None = the domain's h0); appends one ``WeightStepMetrics`` line per step;
replaces ``layout.progress_key`` as each step samples, trains, syncs (``ProgressWriter``); checkpoints at
``saveSteps``, every ``rsft.checkpointEverySteps`` and at the end; keeps resume state
so a killed attempt continues from its last checkpoint with the same data order and optimiser
state; honours STOP and the adaptive ``stopRule``; writes ``WeightPhaseResult`` last.

Sampling: in-process (the transformers backend shares the trained model object: no sync needed)
or a vLLM server (``inference.backend`` openai/vllm, or auto with ``$WHALE_INFERENCE_URL``); then
each step's weights are published through the store to the vLLM pod's weight-sync sidecar
(:class:`whale.rsft.sync.StoreSync`, a cluster), or with :class:`whale.rsft.sync.VLLMReloadSync`
when ``$WHALE_SYNC_DIR`` names a folder the server reads (seen there as ``$WHALE_SYNC_SERVER_DIR``).
Loop and components: ``whale.rsft``.

Several GPUs / nodes: the operator launches this module under torchrun (``torchrun --nnodes=N
--nproc-per-node=G --node-rank=$(NODE_RANK) --master-addr=$(MASTER_ADDR) --master-port=P -m --
whale.workloads train ...``; an Indexed Job with a headless rendezvous Service when N > 1). With
``WORLD_SIZE`` > 1, rank 0 alone reads the request, samples, and talks to the store (metrics,
checkpoints, resume state, STOP, result, weight sync); it sends the start weights, then each step's
tokenised kept trajectories, to the other ranks, and all ranks run data-parallel SFT with a global
token mean (:mod:`whale.rsft.dist`). ``spec.execution.train.deepspeedConfig`` wraps the SFT in a DeepSpeed
ZeRO-2/3 engine (:mod:`whale.rsft.deepspeed_trainer`). Any rank failing fails the attempt (torchrun
stops the rest); the retry resumes from the last checkpoint. One process (no torchrun) is unchanged.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from whale.core import layout
from whale.core.protocol import PhaseKind, WeightPhaseResult, WeightRequest, parse_request
from whale.core.spec import WhaleRunSpec
from whale.rsft import checkpoint as ckpt
from whale.rsft.config import RSFTConfig
from whale.rsft.dist import World, world_from_env
from whale.rsft.phase import WeightPhase, WeightPhaseError, find_start, finish
from whale.store import Store
from whale.workloads.common import (
    ProgressWriter,
    enforces_provenance,
    episode_bounds,
    harness_file,
    harness_limits,
    load_domain,
    read_request,
    read_spec,
    sampling_params,
)

log = logging.getLogger(__name__)

SYNC_DIR_ENV = "WHALE_SYNC_DIR"
SYNC_SERVER_DIR_ENV = "WHALE_SYNC_SERVER_DIR"


def main(store: Store, run: str, phase: str) -> None:
    run_train(store, run, phase)


def run_train(store: Store, run: str, phase: str, *, domain: Any = None) -> WeightPhaseResult | None:
    """The workload; ``domain`` may be injected (tests). Under torchrun (``WORLD_SIZE`` > 1) rank 0
    leads and returns the result; the other ranks follow it and return None (see the module doc)."""
    world = world_from_env()
    if world.distributed:
        return run_distributed(store, run, phase, world, domain=domain)
    request = read_request(store, run, phase, PhaseKind.WEIGHT, WeightPhaseError)
    args = request.weight
    done = store.read_json_or_none(layout.result_key(run, phase))
    if done is not None:
        log.info("phase %s already has a result; nothing to do", phase)
        return WeightPhaseResult.model_validate(done)
    if ckpt.checkpoint_complete(store, run, args.target_step) and args.target_step > args.from_step:
        log.info("checkpoint at target step %d exists: phase %s is done", args.target_step, phase)
        return finish(store, run, phase, args.target_step, "target")

    spec = read_spec(store, run, WeightPhaseError)
    cfg = RSFTConfig.from_spec(spec, args)
    if spec.execution.train.deepspeed_config:
        log.warning(
            "spec.execution.train.deepspeedConfig applies to torchrun launches (WORLD_SIZE > 1); one process trains "
            "without DeepSpeed"
        )
    domain = load_domain(spec, domain)
    items = weight_items(domain, spec, store)
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
        result = sample_and_train(
            store, run, phase, request, spec, cfg, domain, items, start, Path(tmp), model, tokenizer, trainer, model
        )
    log.info("phase %s done: step %d, stopped by %s", phase, result.final_step, result.stopped_by)
    return result


def weight_items(domain: Any, spec: WhaleRunSpec, store: Store) -> list[Any]:
    """D_weight; an empty one is a spec error, not a phase that trains on nothing."""
    items = domain.load_split("weight", spec.experiment.data, store)
    if not items:
        raise WeightPhaseError(
            f"domain {spec.domain!r} has an empty weight split (D_weight); check spec.experiment.data"
        )
    return items


def check_architecture(config: Any, spec: WhaleRunSpec) -> None:
    """Refuse, before any weights are loaded, an ``spec.experiment.rsft`` setting the model's architecture cannot train
    (``whale validate``'s check, on the config the phase really loads)."""
    from whale.rsft.architecture import Architecture, training_problems

    problems = training_problems(Architecture.from_config(config), pack_sequences=spec.experiment.rsft.pack_sequences)
    if problems:
        raise WeightPhaseError("; ".join(problems))


def load_for_training(store: Store, spec: WhaleRunSpec, prefix: str | None, workdir: Path, device: Any):
    """(model, tokenizer) in fp32 (master weights) on ``device``: a store checkpoint or ``spec.experiment.model``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if prefix is not None:
        source, kwargs = str(ckpt.materialise(store, prefix, workdir)), {}
    else:
        source = spec.experiment.model.name
        kwargs = {
            "revision": spec.experiment.model.revision,
            "trust_remote_code": spec.experiment.model.trust_remote_code,
        }
        if spec.experiment.model.gguf_file:
            kwargs["gguf_file"] = spec.experiment.model.gguf_file
    try:
        check_architecture(AutoConfig.from_pretrained(source, **kwargs), spec)
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    except (OSError, ValueError) as exc:
        raise WeightPhaseError(f"cannot load the model to train from {source!r}: {exc}") from exc
    if getattr(model.config, "quantization_config", None) is not None:  # GGUF: dequantised on load
        del model.config.quantization_config
        # (the ignores: attributes transformers sets on a loaded model but does not declare on the class)
        model.hf_quantizer = None  # type: ignore[assignment]
        model.is_quantized = False  # type: ignore[assignment]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.use_cache = False
    keep_hub_form(model, source, kwargs)
    return model.to(device), tokenizer


def keep_hub_form(model: Any, source: str, kwargs: dict[str, Any]) -> None:
    """A language model loaded out of a multimodal checkpoint (the paper's Qwen3.5) remembers that checkpoint's
    form, so that its checkpoints keep it (:mod:`whale.rsft.hub_form`: vLLM serves only that form)."""
    from whale.rsft.hub_form import hub_form_of
    from whale.rsft.sync import saved_names

    folder = Path(source)
    if not folder.is_dir():  # a hub id: the snapshot from_pretrained just read
        from transformers.utils import cached_file

        try:
            config_file = cached_file(source, "config.json", revision=kwargs.get("revision"))
        except OSError:
            return
        if config_file is None:
            return
        folder = Path(config_file).parent
    model.whale_hub_form = hub_form_of(folder, model, saved_names(model, model.state_dict()).values())


def sample_and_train(
    store: Store,
    run: str,
    phase: str,
    request: WeightRequest,
    spec: WhaleRunSpec,
    cfg: RSFTConfig,
    domain: Any,
    items: list[Any],
    start: Any,
    workdir: Path,
    model: Any,
    tokenizer: Any,
    trainer: Any,
    saved_model: Any,
) -> WeightPhaseResult:
    """The weight phase's loop under its harness, shared by one process and the distributed lead: check the
    harness file, open the sampling backend (``model`` samples in process), put a colocated vLLM server to
    sleep around each update, and run the steps. ``trainer`` makes the updates (one process's SFTTrainer, or
    the lead that drives every rank) and ``saved_model`` is what the loop checkpoints."""
    from whale.harness.validate import validate_file
    from whale.rsft.colocated import colocate
    from whale.rsft.sampling import HarnessSampler

    args = request.weight
    harness_path = harness_file(store, args.harness, domain, spec.experiment.data, workdir)
    validate_file(harness_path, domain.allowed_imports)
    client, sync, lock = make_sampling_backend(spec, model, tokenizer, store, run, start.model_prefix)
    trainer, sync = colocate(spec, trainer, sync)  # inference.placement colocated: vLLM sleeps during SFT
    with HarnessSampler(
        domain,
        harness_path,
        client,
        sampling_params(request, spec),
        max_concurrency=spec.execution.inference.max_concurrency,
        harness_label=args.harness or "h0",
        limits=harness_limits(spec),
        bounds=episode_bounds(spec),
        enforce_provenance=enforces_provenance(spec),
    ) as sampler:
        progress = ProgressWriter(store, run, phase)
        sampler.on_episode = progress.advance
        loop = WeightPhase(
            store=store,
            run=run,
            phase=phase,
            args=args,
            cfg=cfg,
            items=items,
            model=saved_model,
            tokenizer=tokenizer,
            trainer=trainer,
            sampler=sampler,
            sync=sync,
            weights_lock=lock,
            progress=progress,
        )
        return loop.run_from(start)


def make_sampling_backend(
    spec: WhaleRunSpec,
    model: Any,
    tokenizer: Any,
    store: Store | None = None,
    run: str | None = None,
    start_prefix: str | None = None,
):
    """(client, weight sync, weights lock): in-process sharing ``model``, or a vLLM server on this GPU with
    ``inference.weightSync: cudaIpc`` (IPC sync), or one with ``$WHALE_SYNC_DIR`` (a folder the server reads:
    reload sync), else the store-based sync of a
    cluster (the vLLM pod's weight-sync sidecar), which first makes the server serve
    ``start_prefix``, the weights this attempt starts from (None = the base model)."""
    from whale.inference.factory import backend_kind, inference_url, make_client
    from whale.rsft.sync import SharedModelSync, StoreSync, VLLMIpcSync, VLLMReloadSync

    if backend_kind(spec) == "http":
        sync_dir = os.environ.get(SYNC_DIR_ENV)
        if spec.execution.inference.weight_sync == "cudaIpc":  # colocated: the server shares the trainer's GPU
            sync: Any = VLLMIpcSync(
                inference_url(spec), timeout_s=float(spec.execution.inference.request_timeout_seconds)
            )
        elif sync_dir:
            sync = VLLMReloadSync(inference_url(spec), Path(sync_dir), os.environ.get(SYNC_SERVER_DIR_ENV))
        elif store is not None and run is not None:
            sync = StoreSync(store, run)
            sync.serve(start_prefix)
        else:
            raise WeightPhaseError(
                f"sampling goes to a vLLM server, so the new weights must reach it: run the vLLM pod with the "
                f"weight-sync sidecar (the operator does), or set ${SYNC_DIR_ENV} to a folder the server can read"
            )
        return make_client(spec), sync, None
    from whale.inference.transformers_backend import TransformersClient

    client = TransformersClient(
        model,
        tokenizer,
        max_batch_size=spec.execution.inference.max_concurrency,
        model_name=spec.experiment.model.served_model_name or spec.experiment.model.name,
        max_model_len=spec.experiment.model.max_model_len,
    )
    return client, SharedModelSync(), client.lock


# ----- several processes (torchrun) -----------------------------------------------------------------


def run_distributed(
    store: Store, run: str, phase: str, world: World, *, domain: Any = None
) -> WeightPhaseResult | None:
    """One rank of a torchrun launch: rank 0 leads (store, sampling), the others follow (SFT only)."""
    from whale.rsft import dist

    device = dist.device_for(world)
    dist.init_process_group(world, device)
    try:
        if world.is_leader:
            result = _lead(store, run, phase, world, device, domain)
        else:
            _follow(world, device)
            result = None
        # every rank leaves together: a peer that tears down first can abort gloo's teardown in the other
        dist.barrier()
        return result
    finally:
        dist.shutdown()


def make_trainer(model: Any, cfg: RSFTConfig, spec: WhaleRunSpec, device: Any, pad_id: int, world: World):
    """Plain data-parallel SFT, or a DeepSpeed engine when ``spec.execution.train.deepspeedConfig`` is set."""
    if spec.execution.train.deepspeed_config:
        from whale.rsft.deepspeed_trainer import DeepSpeedTrainer

        return DeepSpeedTrainer(
            model,
            cfg,
            device=device,
            pad_id=pad_id,
            config_path=spec.execution.train.deepspeed_config,
            world_size=world.size,
        )
    from whale.rsft.trainer import SFTTrainer

    return SFTTrainer(model, cfg, device=device, pad_id=pad_id)


def _lead(store: Store, run: str, phase: str, world: World, device: Any, domain: Any) -> WeightPhaseResult:
    from whale.rsft import dist

    leader = dist.LeaderTrainer(None)
    try:
        request = read_request(store, run, phase, PhaseKind.WEIGHT, WeightPhaseError)
        args = request.weight
        done = store.read_json_or_none(layout.result_key(run, phase))
        if done is not None or (
            ckpt.checkpoint_complete(store, run, args.target_step) and args.target_step > args.from_step
        ):
            result = (
                WeightPhaseResult.model_validate(done)
                if done is not None
                else finish(store, run, phase, args.target_step, "target")
            )
            dist.broadcast_object(("done",))
            return result
        spec = read_spec(store, run, WeightPhaseError)
        cfg = RSFTConfig.from_spec(spec, args)
        check_deepspeed(spec)
        domain = load_domain(spec, domain)
        items = weight_items(domain, spec, store)
        start = find_start(store, run, phase, args)

        import torch

        torch.manual_seed(cfg.seed)
        with tempfile.TemporaryDirectory(prefix="whale-train-") as tmp:
            model, tokenizer = load_for_training(store, spec, start.model_prefix, Path(tmp), device)
            pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
            leader.in_collective = True
            dist.broadcast_object(("start", request.to_wire(), spec.to_wire(), model.config.to_json_string(), pad_id))
            dist.broadcast_module(model)
            trainer = make_trainer(model, cfg, spec, device, pad_id, world)
            optimizer_state = dist.broadcast_tree(start.optimizer_state, device)
            if optimizer_state is not None:
                trainer.load_optimizer_state(optimizer_state)
            leader.trainer = trainer
            leader.in_collective = False
            # the loop checkpoints the weights gathered from every rank, not rank 0's local module
            saved_model = dist.GatheringModel(model, leader)
            result = sample_and_train(
                store,
                run,
                phase,
                request,
                spec,
                cfg,
                domain,
                items,
                start,
                Path(tmp),
                model,
                tokenizer,
                leader,
                saved_model,
            )
        leader.end()
    except BaseException as exc:
        leader.abort(f"{type(exc).__name__}: {exc}")
        raise
    log.info(
        "phase %s done on %d ranks: step %d, stopped by %s", phase, world.size, result.final_step, result.stopped_by
    )
    return result


def check_deepspeed(spec: WhaleRunSpec) -> None:
    """ZeRO-3 shards the weights over the ranks, so rank 0 cannot generate from them by itself."""
    if not spec.execution.train.deepspeed_config:
        return
    from whale.inference.factory import backend_kind
    from whale.rsft.deepspeed_trainer import read_config, zero_stage

    if zero_stage(read_config(spec.execution.train.deepspeed_config)) >= 3 and backend_kind(spec) != "http":
        raise WeightPhaseError(
            f"spec.execution.train.deepspeedConfig {spec.execution.train.deepspeed_config} is ZeRO-3, which shards the weights over the "
            "ranks, so rank 0 cannot sample from them in process: sample through the run's vLLM server "
            "(inference.backend vllm/openai) or use a ZeRO-2 config (images/worker/ds_zero2.json)"
        )


def _follow(world: World, device: Any) -> None:
    """A follower never touches the store: everything comes from rank 0 over the process group."""
    from whale.rsft import dist

    message = dist.broadcast_object(None)
    if message[0] == "done":
        return
    if message[0] == "abort":
        raise dist.FollowerAbort(f"rank 0 failed: {message[1]}")
    _, request_wire, spec_wire, config_json, pad_id = message
    request = parse_request(request_wire)
    if not isinstance(request, WeightRequest):
        raise dist.FollowerAbort(f"rank 0 sent a {request.kind.value} request to a weight phase")
    spec = WhaleRunSpec.model_validate(spec_wire)
    cfg = RSFTConfig.from_spec(spec, request.weight)
    model = model_from_config(config_json, spec, device)
    dist.broadcast_module(model)
    trainer = make_trainer(model, cfg, spec, device, int(pad_id), world)
    optimizer_state = dist.broadcast_tree(None, device)
    if optimizer_state is not None:
        trainer.load_optimizer_state(optimizer_state)
    calls = dist.follow(trainer)
    log.info("rank %d done: %d SFT steps", world.rank, calls)


def model_from_config(config_json: str, spec: WhaleRunSpec, device: Any):
    """An fp32 model of the leader's architecture (its weights arrive by broadcast afterwards)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="whale-config-") as tmp:
        Path(tmp, "config.json").write_text(config_json, encoding="utf-8")
        config = AutoConfig.from_pretrained(tmp, trust_remote_code=spec.experiment.model.trust_remote_code)
    config.use_cache = False
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, trust_remote_code=spec.experiment.model.trust_remote_code
    )
    return model.to(device)
