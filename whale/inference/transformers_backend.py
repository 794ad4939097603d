"""In-process inference with transformers: batched generation with the chat template.

For machines without a GPU (and for RSFT on the CPU): concurrent ``chat`` calls are queued and
batched (requests with equal sampling parameters, ``max_tokens`` and the seed aside, share one ``generate``
call, left-padded, each row cut at its own ``max_tokens``), and generation runs in a worker thread so the
event loop keeps serving harness hooks meanwhile. A seeded request (``SamplingParams.seed``) samples each
of its rows from a generator of its own (``seed + j`` for completion ``j``, as vLLM does), so its replies do
not depend on what else shares the batch; unseeded requests sample from torch's global generator. The
generated text is decoded whole: a thinking model's ``<think>...</think>`` stays in ``content``, as vLLM
gives it without a reasoning parser.

Sharing weights with a trainer: pass the trainer's ``model`` object in. Every ``generate`` reads
the model's current parameters, so after an optimizer step the next rollout samples from the new
weights (no copy, no reload). Hold :attr:`TransformersClient.lock` while stepping the optimizer
(generation takes it too), so a batch never sees half-updated weights. Generation switches the model
to eval mode and restores its previous mode afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from whale.inference.base import ChatResult, Completion, InferenceClient, InferenceError, SamplingParams
from whale.inference.toolcalls import PARSERS, assistant_message, parser_for_template

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Request:
    messages: list[dict[str, Any]]
    sampling: SamplingParams
    n: int
    tools: list[dict[str, Any]] | None
    future: asyncio.Future[ChatResult]
    enqueued: float


def load_model(
    name: str,
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    dtype: str = "auto",
    device: str | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) from an HF id or a local folder; ``gguf_file`` loads a GGUF inside it
    (dequantised by transformers; CPU demo models)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError) as exc:
        raise InferenceError(f"cannot load model {name!r}{' / ' + gguf_file if gguf_file else ''}: {exc}") from exc
    # (the ignores: transformers wraps PreTrainedModel.to in a decorator whose self mypy cannot bind)
    if device:
        model.to(device)  # type: ignore[arg-type]
    elif torch.cuda.is_available():
        model.to("cuda")  # type: ignore[arg-type]
    return model, tokenizer


class TransformersClient(InferenceClient):
    """In-process chat completions over a transformers causal LM.

    Args:
        model, tokenizer: loaded objects (share them with a trainer), or use :meth:`from_pretrained`.
        max_model_len: prompt + max_tokens limit (capped by the model's ``max_position_embeddings``).
        max_batch_size: prompt rows per ``generate`` call (n samples count as n rows).
        batch_wait_s: how long the batcher waits for more requests before generating.
        model_name: the name reported in traces and by the server.
        chat_template_kwargs: extra chat-template variables (e.g. ``{"enable_thinking": False}``); a
            request's own (``SamplingParams.chat_template_kwargs``) take precedence.
        tool_parser: how generated tool calls are written (``whale.inference.toolcalls.PARSERS``, vLLM's
            names); None = the one the tokenizer's chat template writes (``qwen3_coder`` or ``hermes``).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.01,
        model_name: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_model_len: int | None = None,
        tool_parser: str | None = None,
    ):
        self.hf_model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.model = model_name or getattr(getattr(model, "config", None), "_name_or_path", None) or "in-process"
        first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        self.device = first.device.type if first is not None else None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        template = getattr(tokenizer, "chat_template", None)
        self.tool_parser = tool_parser or parser_for_template(template if isinstance(template, str) else None)
        if self.tool_parser not in PARSERS:
            raise ValueError(f"unknown tool-call parser {self.tool_parser!r}; known: {', '.join(PARSERS)}")
        #: prompt + max_tokens may not exceed this (like vLLM's --max-model-len)
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        limits = [n for n in (max_model_len, positions) if isinstance(n, int) and n > 0]
        self.max_model_len = min(limits) if limits else None
        #: held during generation; a trainer holds it while it changes the weights
        self.lock = threading.Lock()
        #: held while the tokenizer encodes: a batch encode with padding reconfigures the (Rust) tokenizer,
        #: which another thread's encode must not see half done
        self._tokenizer_lock = threading.Lock()
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._eos_ids = _eos_ids(model, tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        name: str,
        *,
        gguf_file: str | None = None,
        revision: str | None = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> TransformersClient:
        model, tokenizer = load_model(name, gguf_file=gguf_file, revision=revision, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, model_name=kwargs.pop("model_name", None) or Path(name).name, **kwargs)

    # ----- client interface ------------------------------------------------------------------------

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        if n < 1:
            raise InferenceError(f"n must be >= 1, got {n}")
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop or self._worker is None or self._worker.done():
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = loop.create_task(self._batcher())
        future: asyncio.Future[ChatResult] = loop.create_future()
        await self._queue.put(_Request(messages, sampling, n, tools, future, time.perf_counter()))
        return await future

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None

    # ----- batching ---------------------------------------------------------------------------------

    async def _batcher(self) -> None:
        assert self._queue is not None  # noqa: S101 - set before the task starts
        queue = self._queue
        held: list[_Request] = []
        while True:
            first = held.pop(0) if held else await queue.get()
            batch, rows = [first], first.n
            deadline = time.perf_counter() + self.batch_wait_s
            while rows < self.max_batch_size:
                candidates = [r for r in held if _key(r) == _key(first)]
                if candidates:
                    request = candidates[0]
                    held.remove(request)
                else:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    try:
                        request = await asyncio.wait_for(queue.get(), left)
                    except TimeoutError:
                        break
                    if _key(request) != _key(first):
                        held.append(request)
                        continue
                if rows + request.n > self.max_batch_size:
                    held.insert(0, request)
                    break
                batch.append(request)
                rows += request.n
            await self._run_batch(batch)

    async def _run_batch(self, batch: list[_Request]) -> None:
        """Generate for a batch; when it fails, retry its requests one by one so that one bad prompt
        (too long, a template error) fails only its own caller."""
        try:
            results = await asyncio.to_thread(self._generate, batch)
        except Exception as exc:  # noqa: BLE001 - every waiting caller gets a typed error
            if len(batch) > 1:
                for request in batch:
                    await self._run_batch([request])
                return
            log.warning("in-process generation failed: %s", exc)
            error = exc if isinstance(exc, InferenceError) else InferenceError(f"in-process generation failed: {exc}")
            if not batch[0].future.done():
                batch[0].future.set_exception(error)
            return
        for request, result in zip(batch, results, strict=True):
            if not request.future.done():
                request.future.set_result(result)

    # ----- generation (worker thread) ---------------------------------------------------------------

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text: the tokenizer's chat template with the generation prompt, rendered with this
        client's ``chat_template_kwargs`` and then the request's (``SamplingParams.chat_template_kwargs``)."""
        try:
            return self.tokenizer.apply_chat_template(
                _template_messages(messages),
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
                **{**self.chat_template_kwargs, **(template_kwargs or {})},
            )
        except Exception as exc:  # jinja errors come in many types
            raise InferenceError(f"the chat template failed on these messages: {exc}") from exc

    async def count_prompt_tokens(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> int | None:
        """The exact prompt length ``chat`` would generate from (rendered and tokenised the same way), in
        a worker thread: the event loop keeps serving while a long conversation is rendered."""
        return await asyncio.to_thread(self._count_prompt_tokens, messages, tools, sampling.template_kwargs)

    def _count_prompt_tokens(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]
    ) -> int:
        text = self.render(messages, tools, template_kwargs)
        with self._tokenizer_lock:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _generate(self, batch: list[_Request]) -> list[ChatResult]:
        import torch

        started = time.perf_counter()
        sampling = batch[0].sampling  # the batch shares it but for max_tokens (see _key)
        max_new = max(r.sampling.max_tokens for r in batch)
        texts = [self.render(r.messages, r.tools, r.sampling.template_kwargs) for r in batch]
        tok = self.tokenizer
        rows = [t for t, r in zip(texts, batch, strict=True) for _ in range(r.n)]
        with self._tokenizer_lock:
            tok.padding_side = "left"
            encoded = tok(rows, return_tensors="pt", padding=True, add_special_tokens=False)
            prompt_lens = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        if self.max_model_len is not None:
            for length, request in zip(prompt_lens, batch, strict=True):
                if length + request.sampling.max_tokens > self.max_model_len:
                    raise InferenceError(
                        f"prompt of {length} tokens + max_tokens {request.sampling.max_tokens} exceeds max_model_len "
                        f"{self.max_model_len}"
                    )
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "pad_token_id": tok.pad_token_id,
            "eos_token_id": sorted(self._eos_ids),
        }
        seeded = sampling.temperature > 0 and any(r.sampling.seed is not None for r in batch)
        if sampling.temperature > 0 and not seeded:
            kwargs.update(
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else 0,
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with self.lock:
            model = self.hf_model
            device = next(model.parameters()).device
            was_training = model.training
            model.eval()
            try:
                if seeded:  # each row samples from its own generator; greedy decoding takes its pick
                    kwargs["logits_processor"] = seeded_sampling(sampling, row_seeds(batch), device)
                with torch.inference_mode():
                    out = model.generate(
                        input_ids=encoded["input_ids"].to(device),
                        attention_mask=encoded["attention_mask"].to(device),
                        **kwargs,
                    )
            finally:
                model.train(was_training)
        generated = out[:, encoded["input_ids"].shape[1] :].tolist()
        log.debug("generated %d rows in %.3f s", len(rows), time.perf_counter() - started)
        results, row = [], 0
        for request, prompt_len in zip(batch, prompt_lens, strict=True):
            completions = []
            for _ in range(request.n):
                # rows of a batch generate up to the batch's longest max_tokens: each keeps its own
                completions.append(self._completion(generated[row][: request.sampling.max_tokens], request.tools))
                row += 1
            total = sum(c.completion_tokens for c in completions)
            results.append(ChatResult(completions, prompt_len, total, time.perf_counter() - request.enqueued))
        return results

    def _completion(self, ids: list[int], tools: list[dict[str, Any]] | None) -> Completion:
        cut = next((i for i, t in enumerate(ids) if t in self._eos_ids), None)
        kept = ids if cut is None else ids[:cut]
        finish = "length" if cut is None else "stop"
        text = self.tokenizer.decode(kept, skip_special_tokens=False)
        message: dict[str, Any] = (
            assistant_message(text, self.tool_parser, tools)
            if tools is not None
            else {"role": "assistant", "content": text}
        )
        if message.get("tool_calls") and finish == "stop":
            finish = "tool_calls"
        # the ids of what was generated, the stop token included (what RSFT trains on)
        token_ids = kept if cut is None else ids[: cut + 1]
        return Completion(message=message, finish_reason=finish, completion_tokens=len(token_ids), token_ids=token_ids)


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat templates expect tool-call arguments as dicts; OpenAI messages carry JSON strings."""
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if k != "finish_reason"}
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call.get("function") or {})
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except ValueError:
                        pass
                calls.append({**call, "function": function})
            message["tool_calls"] = calls
        out.append(message)
    return out


def _key(request: _Request) -> SamplingParams:
    """Requests that may share one ``generate`` call: equal sampling but for ``max_tokens`` (the episode
    runner clamps it per call, so it differs between episodes; each row is cut at its own), the
    chat-template variables (each prompt is rendered on its own) and the seed (each row samples from its
    own generator, :func:`seeded_sampling`)."""
    return dataclasses.replace(
        request.sampling, max_tokens=1, chat_template_kwargs=(), episode_tokens=None, episode_window=None, seed=None
    )


def row_seeds(batch: list[_Request]) -> list[int]:
    """One seed per generated row: ``seed + j`` for completion ``j`` of a seeded request (as vLLM seeds
    the ``j``-th sample of an ``n``-sample request); a row of an unseeded request in the same batch
    draws its seed from torch's global generator (random, as unseeded sampling is)."""
    import torch

    seeds: list[int] = []
    for request in batch:
        base = request.sampling.seed
        if base is None:
            seeds.extend(int(torch.randint(0, 2**31 - 1, ())) for _ in range(request.n))
        else:
            seeds.extend(base + j for j in range(request.n))
    return seeds


class RowSeededSampler:
    """A logits processor that samples each row's next token from the row's own ``torch.Generator``
    (inverse CDF of the warped distribution) and leaves only that token possible, so greedy decoding
    emits it. A row's tokens then depend on its seed and its own logits only, not on which other rows
    share the batch or on the global RNG."""

    def __init__(self, seeds: list[int], device: Any):
        import torch

        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        probs = torch.softmax(scores.float(), dim=-1)
        cdf = probs.cumsum(dim=-1)
        picks = []
        for row, generator in enumerate(self.generators):
            u = torch.rand((), generator=generator, device=scores.device) * cdf[row, -1]
            picks.append(torch.searchsorted(cdf[row], u.reshape(1)).clamp(max=scores.shape[-1] - 1))
        chosen = torch.cat(picks).unsqueeze(1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(1, chosen, 0.0)


def seeded_sampling(sampling: SamplingParams, seeds: list[int], device: Any) -> Any:
    """Temperature, top-k and top-p (transformers' warpers, in generate's order), then
    :class:`RowSeededSampler`: the processors of a seeded batch, decoded greedily."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    processors: list[Any] = []
    if sampling.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k > 0:
        processors.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        processors.append(TopPLogitsWarper(sampling.top_p))
    processors.append(RowSeededSampler(seeds, device))
    return LogitsProcessorList(processors)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for token in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids
