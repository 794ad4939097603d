"""Colocated placement (``inference.placement: colocated``): the vLLM server runs on the trainer's GPUs
and sleeps while the trainer updates the weights, as verl's hybrid engine does.

With the server on GPUs of its own (``separate``, the paper's launchers), each side idles while the
other works. Colocated, one set of GPUs does both in turn; per RSFT step:

    generation (server awake)
    POST /sleep?level=L                 before the SFT update: the server gives back its GPU memory
    SFT update; torch.cuda.empty_cache() the trainer gives back its activations' cached blocks
    POST /wake_up                       level 1: everything (the weights come back from host memory)
    POST /wake_up?tags=weights          level 2: the weight buffers only (their content was dropped) ...
    weight sync (reload from a folder)  ... the new weights are loaded into them ...
    POST /wake_up?tags=kv_cache         ... then the KV cache (verl's order: never both at once)
    generation of the next step

A step that keeps no trajectory makes no update, so the server is not put to sleep. With
``inference.sleepLevel: 0`` it is never put to sleep (verl's ``free_cache_engine: false``): the server keeps its
share of the GPU through SFT and only the weight sync remains. The trainer's own
weights and optimiser state stay on the GPU throughout: the server's share while awake is
``inference.colocatedGpuMemoryUtilization``. The in-process transformers backend needs none of this: it
generates with the very model it trains, on the same GPU (it is always colocated).
"""

from __future__ import annotations

import logging
from typing import Any

from whale.core.spec import WhaleRunSpec
from whale.inference.vllm_control import VLLMControl

log = logging.getLogger(__name__)


def _release_cached_gpu_memory() -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - the trainer always has torch
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class SleepDuringTraining:
    """A trainer whose ``train`` puts the server to sleep first and wakes it (or its weights) after."""

    def __init__(self, trainer: Any, control: VLLMControl, level: int):
        self.trainer = trainer
        self.control = control
        self.level = level
        #: seconds of the last step's sleep + wake calls (logged; not part of the SFT time)
        self.last_seconds = 0.0

    def __getattr__(self, name: str) -> Any:  # optimizer_state, load_optimizer_state, ...: the trainer's
        return getattr(self.trainer, name)

    def train(self, examples: Any, **kwargs: Any) -> Any:
        slept = self.control.sleep(self.level)
        try:
            stats = self.trainer.train(examples, **kwargs)
        finally:
            _release_cached_gpu_memory()
            woke = self.control.wake_up(("weights",) if self.level == 2 else ())
        self.last_seconds = slept + woke
        log.info(
            "colocated vLLM: slept (level %d) %.2f s and woke in %.2f s around the SFT update", self.level, slept, woke
        )
        return stats


class WakeCacheAfterSync:
    """Level 2: after the weight sync has loaded the new weights, wake the KV cache too."""

    def __init__(self, sync: Any, control: VLLMControl):
        self.sync_ = sync
        self.control = control

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sync_, name)

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        seconds = self.sync_.sync(model, tokenizer, step)
        return seconds + self.control.wake_up(("kv_cache",))


def colocate(spec: WhaleRunSpec, trainer: Any, sync: Any, base_url: str | None = None) -> tuple[Any, Any]:
    """(trainer, sync) for this spec: unchanged unless the server is colocated; then wrapped so the server
    sleeps during each update. ``base_url``: the server's OpenAI URL (default: the spec's HTTP backend's,
    ``$WHALE_INFERENCE_URL``); the in-process backend has no server and is returned unchanged."""
    inf = spec.execution.inference
    if inf.placement != "colocated" or inf.sleep_level == 0:
        return trainer, sync  # level 0: the server stays awake; the sync alone brings it the new weights
    if base_url is None:
        from whale.inference.factory import backend_kind, inference_url

        if backend_kind(spec) != "http":
            return trainer, sync  # transformers in process: generation already shares the trainer's GPU
        base_url = inference_url(spec)
    control = VLLMControl(base_url, timeout_s=float(inf.request_timeout_seconds))
    trainer = SleepDuringTraining(trainer, control, inf.sleep_level)
    if inf.sleep_level == 2:
        sync = WakeCacheAfterSync(sync, control)
    return trainer, sync
