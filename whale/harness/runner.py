"""The episode loop: harness hooks ↔ model ↔ environment, many episodes at once.

One :class:`EpisodeRunner` = one domain + one harness process + one inference client. Episodes run
as asyncio tasks under a semaphore (``max_concurrency`` in flight). Each episode follows the loop
documented in ``whale.harness.api``; its outcome is an :class:`~whale.harness.trace.Episode`, never
an exception: a failing harness hook, inference call or environment ends the episode with
``end="error"``, reward 0 and a one-line ``error`` (the proposer reads these). Rewards come from the
domain's verifier (``Environment.reward``) after the episode ends, however it ends, except on error.

Answer provenance (:mod:`whale.harness.provenance`): after the verifier, an episode whose graded answer no
model reply holds scores 0, and gold in the harness's own messages is marked. Bounds
(:class:`EpisodeBounds`, ``spec.execution.sandbox.episode``): actions, bytes per message and per episode, wall time
(and an evaluation's deadline); past one the episode ends with ``end="limit"``, reward 0.

Token budget of an episode (the paper's, ``SamplingParams.episode_*``): every model call's
``max_tokens`` is the least of the per-call cap (``max_tokens``), the episode's generated tokens
left (``episode_tokens`` minus what its calls generated), the window left (``episode_window`` minus
the growth of the prompt since the first call: assistant and tool/environment tokens) and the
server's context left (``max_model_len`` minus the prompt). When that is < 1 the episode ends with
``end="token_budget"`` before calling the model (the verifier still scores it). The prompt is counted
when the client can (in process), else estimated from the previous call's prompt + completion tokens
plus an upper bound of the messages added since (their UTF-8 bytes plus a framing allowance: a
byte-level BPE token is at least one byte), so a clamp never lets a request run past the context.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from whale.domain import Domain, DomainError, Environment
from whale.harness import provenance
from whale.harness.launch import SandboxLimits
from whale.harness.process import HarnessError, HarnessPool, HarnessProcess
from whale.harness.trace import EndReason, Episode
from whale.inference.base import ChatResult, Completion, InferenceClient, InferenceError, SamplingParams, call_seed

log = logging.getLogger(__name__)

#: seconds between flushes of the traces file of :func:`run_episodes`
TRACE_FLUSH_S = 1.0
#: tokens a chat template may add around one message (role header, end-of-turn, newlines) on top of
#: its content, for the prompt estimate of a client that cannot count tokens
MESSAGE_FRAMING_TOKENS = 8

#: bounds of one episode (RunnerConfig; docs/security.md, "Bounds"): a harness that loops tool actions or
#: sends huge messages ends its episode with ``end="limit"``, reward 0, and the runner's memory stays bounded
DEFAULT_MAX_ACTIONS = 256
DEFAULT_MAX_MESSAGE_BYTES = 256 << 10
DEFAULT_MAX_EPISODE_BYTES = 4 << 20
DEFAULT_EPISODE_TIMEOUT_S = 1800.0


@dataclasses.dataclass
class EpisodeTokens:
    """What an episode's model calls have used so far, for the per-call ``max_tokens`` clamp."""

    #: prompt tokens of the episode's first call (the window counts from there); None before it
    first_prompt: int | None = None
    #: prompt and completion tokens of the latest call
    last_prompt: int = 0
    last_completion: int = 0
    #: messages the latest call's prompt and reply cover (later ones were added by the harness since)
    covered_messages: int = 0


def message_tokens_upper_bound(messages: list[dict[str, Any]]) -> int:
    """At least as many tokens as these messages take in a prompt: every token of a byte-level BPE
    is one byte or more, plus :data:`MESSAGE_FRAMING_TOKENS` per message for the template's framing."""
    return sum(len(json.dumps(m, ensure_ascii=False).encode("utf-8")) + MESSAGE_FRAMING_TOKENS for m in messages)


def call_max_tokens(
    sampling: SamplingParams, *, generated: int, prompt_tokens: int, first_prompt: int | None, max_model_len: int | None
) -> tuple[int, str]:
    """``max_tokens`` of the next model call and the limit that sets it (see the module doc). Pure.

    ``generated``: tokens the episode's calls generated so far; ``prompt_tokens``: of the next prompt
    (counted or estimated); ``first_prompt``: of the episode's first prompt (None: this is the first)."""
    limits = {"maxResponseTokens": sampling.max_tokens}
    if sampling.episode_tokens is not None:
        limits["episodeTokenBudget"] = sampling.episode_tokens - generated
    if sampling.episode_window is not None:
        limits["episodeWindowTokens"] = sampling.episode_window - (prompt_tokens - (first_prompt or prompt_tokens))
    if max_model_len is not None:
        limits["maxModelLen"] = max_model_len - prompt_tokens
    name = min(limits, key=lambda k: limits[k])
    return limits[name], name


class EpisodeError(RuntimeError):
    """Ends one episode with ``end="error"``; carries the one-line reason."""


class EpisodeLimit(EpisodeError):
    """Ends one episode with ``end="limit"``: it reached a bound of :class:`RunnerConfig`."""


@dataclasses.dataclass(frozen=True)
class EpisodeBounds:
    """What one episode may take, whatever its harness does (``spec.execution.sandbox.episode``). On reaching one the
    episode ends with ``end="limit"``, reward 0 and the reason in ``error``."""

    #: actions (environment steps and tool calls) one episode may ask for
    max_actions: int = DEFAULT_MAX_ACTIONS
    #: UTF-8 bytes of one message a hook adds, or of one action's JSON
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: UTF-8 bytes of every message of one episode together (the model's replies included)
    max_episode_bytes: int = DEFAULT_MAX_EPISODE_BYTES
    #: wall seconds of one episode (harness hooks, model calls, tools), not counting its wait for a slot
    timeout_s: float = DEFAULT_EPISODE_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
    """Knobs of the episode loop."""

    #: episodes in flight at once (each holds at most one inference request)
    max_concurrency: int = 64
    #: wall seconds one tool call may take
    tool_timeout_s: float = 120.0
    #: store generated token ids in the trace (RSFT wants them; eval does not)
    record_token_ids: bool = False
    #: label of the harness in traces (path or store key)
    harness_label: str | None = None
    #: the first model call of an item's k episodes is one request with n=k when their prompts are
    #: equal (the usual case: ``start`` is a function of the task): the server prefills the prompt once
    share_first_turn: bool = False
    #: seed every model call from (seed, item id, sample, turn) (:func:`whale.inference.base.call_seed`),
    #: so the same model and harness sample the same episodes whatever the concurrency; None: unseeded
    seed: int | None = None
    #: what one episode may take (``spec.execution.sandbox.episode``)
    bounds: EpisodeBounds = EpisodeBounds()
    #: ``time.monotonic()`` after which every episode ends at once with ``end="limit"`` (an evaluation's
    #: wall-time bound, ``spec.experiment.evaluation.timeoutSeconds``); None: none
    deadline: float | None = None
    #: score 0 an episode whose graded answer is not model text (the provenance rule); False only under
    #: ``spec.experiment.harnessSearch.integrity.action: off`` (the verdict is still recorded in the trace)
    enforce_provenance: bool = True


def check_tools(tools: list[dict[str, Any]] | None, domain: Domain) -> list[dict[str, Any]] | None:
    """A harness's ``TOOLS`` (untrusted), refused unless every one names a tool of ``domain``
    (:meth:`Domain.tool_specs`); the description and parameters are the harness's own."""
    if not tools:
        return tools
    offered = {name for name in (_tool_name(t) for t in domain.tool_specs()) if name is not None}
    listed = [_tool_name(t) for t in tools]
    foreign = [n for n in listed if n not in offered]
    if foreign:
        raise HarnessError(
            f"TOOLS lists {', '.join(repr(n) for n in foreign)[:300]}, which domain "
            f"{getattr(domain, 'name', '?')!r} does not offer; a harness may list only its domain's "
            f"tools: {', '.join(sorted(offered)) or 'none'}"
        )
    return tools


def _tool_name(spec: Any) -> str | None:
    """The function name of an OpenAI tool schema (``{"type": "function", "function": {"name": ...}}``)."""
    fn = spec.get("function") if isinstance(spec, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


class EpisodeRunner:
    """Runs episodes of ``domain`` with the harness behind ``harness`` and the model behind ``client``."""

    def __init__(
        self,
        domain: Domain,
        harness: HarnessProcess | HarnessPool,
        client: InferenceClient,
        sampling: SamplingParams,
        config: RunnerConfig | None = None,
    ):
        self.domain = domain
        self.harness = harness
        self.client = client
        self.sampling = sampling
        self.config = config or RunnerConfig()
        self._slots = asyncio.Semaphore(self.config.max_concurrency)
        #: per running episode (by id): [actions, message bytes] so far, for the bounds
        self._used: dict[int, list[int]] = {}

    async def run(
        self,
        items: Iterable[dict[str, Any]],
        k: int = 1,
        on_episode: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        """``k`` episodes per item, all concurrently (bounded); results in (item, sample) order.
        ``on_episode`` is called as each finishes (progress, streaming traces)."""
        await self.harness.start()

        async def one(item: dict[str, Any], sample: int, first: SharedFirstTurn | None) -> Episode:
            async with self._slots:
                episode = await self.run_episode(item, sample, first)
            if on_episode is not None:
                on_episode(episode)
            return episode

        share = self.config.share_first_turn and k > 1
        tasks: list[Awaitable[Episode]] = []
        for item in items:
            first = SharedFirstTurn(k, self._seed(str(item.get("id", "?")), None, 0)) if share else None
            tasks.extend(one(item, s, first) for s in range(k))
        return list(await asyncio.gather(*tasks))

    async def run_episode(self, item: dict[str, Any], sample: int = 0, first: SharedFirstTurn | None = None) -> Episode:
        """One episode (no concurrency limit of its own; :meth:`run` applies it). ``first``: the
        first model call shared with the item's other samples."""
        item_id = str(item.get("id", "?"))
        episode = Episode(
            episode_id=f"{item_id}#{sample}",
            item_id=item_id,
            sample=sample,
            subset=self.domain.subset(item),
            domain=getattr(self.domain, "name", None),
            harness=self.config.harness_label or str(self.harness.path),
            model=getattr(self.client, "model", None),
            started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        started = time.perf_counter()
        env: Environment | None = None
        env_texts: list[tuple[int, Any]] = []
        try:
            env = self.domain.make_env(item)
            episode.end = await self._bounded_loop(env, episode, first, env_texts)
            episode.reward = float(env.reward())
            self._check_provenance(env, episode, env_texts)
        except EpisodeLimit as exc:
            episode.end, episode.error, episode.reward = EndReason.LIMIT, _one_line(exc), 0.0
        except (EpisodeError, HarnessError, InferenceError, DomainError) as exc:
            episode.end, episode.error, episode.reward = EndReason.ERROR, _one_line(exc), 0.0
        except Exception as exc:  # a bug in domain code must not sink the other episodes
            log.exception("episode %s failed", episode.episode_id)
            episode.end, episode.error, episode.reward = EndReason.ERROR, f"internal: {_one_line(exc)}", 0.0
        finally:
            self._used.pop(id(episode), None)
            if env is not None:
                try:
                    env.close()
                except Exception:  # closing must not hide the episode's outcome
                    log.exception("closing the environment of %s failed", episode.episode_id)
            episode.seconds = time.perf_counter() - started
        return episode

    async def _bounded_loop(
        self, env: Environment, ep: Episode, first: SharedFirstTurn | None, env_texts: list[tuple[int, Any]]
    ) -> str:
        """:meth:`_loop` within the episode's wall time, cut by the evaluation's deadline (EpisodeLimit past it)."""
        cfg = self.config
        seconds = cfg.bounds.timeout_s
        if cfg.deadline is not None:
            seconds = min(seconds, cfg.deadline - time.monotonic())
        timeout = asyncio.timeout(max(0.0, seconds))
        try:
            async with timeout:
                return await self._loop(env, ep, first, env_texts)
        except TimeoutError:
            if not timeout.expired():
                raise  # not ours: a step's own timeout
            if cfg.deadline is not None and time.monotonic() >= cfg.deadline:
                raise EpisodeLimit("the evaluation's wall-time bound had passed") from None
            raise EpisodeLimit(f"the episode ran past its wall-time bound of {cfg.bounds.timeout_s:g} s") from None

    def _check_provenance(self, env: Environment, ep: Episode, env_texts: list[tuple[int, Any]]) -> None:
        """The answer-provenance rule (:mod:`whale.harness.provenance`): an answer no model reply holds scores 0."""
        verdict = provenance.check(
            ep.messages,
            (s["message_index"] for s in ep.steps if s.get("type") == "model"),
            env_texts,
            (s["graded"] for s in ep.steps if s.get("graded")),
            env.gold_answers(),
        )
        ep.answer_not_model, ep.answer_injected, ep.integrity = (
            bool(verdict.not_model),
            bool(verdict.injected),
            verdict.reason,
        )
        if verdict.not_model and self.config.enforce_provenance:
            ep.reward = 0.0

    async def _loop(
        self, env: Environment, ep: Episode, first: SharedFirstTurn | None, env_texts: list[tuple[int, Any]]
    ) -> str:
        info = await self.harness.start()
        max_turns = info.max_turns
        if self.domain.max_turns_limit is not None:
            max_turns = min(max_turns, self.domain.max_turns_limit)
        tools = check_tools(info.tools, self.domain) or None
        state: dict[str, Any] = {}
        used = EpisodeTokens()

        t0 = time.perf_counter()
        task = env.reset()
        ep.env_seconds += time.perf_counter() - t0
        env_texts.append((0, task))
        decision, state = await self._hook(ep, "start", {"task": task}, state)
        while True:
            while decision["actions"]:
                results, env_done = await self._execute(env, ep, decision["actions"])
                env_texts.append((len(ep.messages), results))
                if env_done:
                    return EndReason.ENV_DONE
                if decision["done"]:
                    return EndReason.HARNESS_DONE
                decision, state = await self._hook(ep, "observe", {"results": results}, state)
            if decision["done"]:
                return EndReason.HARNESS_DONE
            if ep.turns >= max_turns:
                return EndReason.MAX_TURNS
            reply = await self._model(ep, tools, used, first if ep.turns == 0 else None)
            if reply is None:
                return EndReason.TOKEN_BUDGET
            decision, state = await self._hook(ep, "parse", {"reply": reply}, state)

    async def _hook(self, ep: Episode, hook: str, args: dict[str, Any], state: dict[str, Any]):
        t0 = time.perf_counter()
        decision, state = await self.harness.call(hook, args, state)
        ep.harness_seconds += time.perf_counter() - t0
        self._bound(ep, hook, decision)
        ep.messages.extend(decision["messages"])
        ep.steps.append(
            {"type": "decision", "hook": hook, "messages_added": len(decision["messages"]), "done": decision["done"]}
        )
        return decision, state

    def _bound(self, ep: Episode, hook: str, decision: dict[str, Any]) -> None:
        """Refuse a decision past the episode's bounds (actions, message bytes) before any of it is kept."""
        cfg = self.config.bounds
        used = self._used.setdefault(id(ep), [0, 0])  # [actions, message bytes] so far
        actions = used[0] + len(decision["actions"])
        if actions > cfg.max_actions:
            raise EpisodeLimit(f"hook {hook} asked for action {actions}; an episode may take at most {cfg.max_actions}")
        for what, values in (("message", decision["messages"]), ("action", decision["actions"])):
            for value in values:
                size = _json_bytes(value)
                if size > cfg.max_message_bytes:
                    raise EpisodeLimit(
                        f"hook {hook} sent a {what} of {size} bytes; one may have at most {cfg.max_message_bytes}"
                    )
        total = used[1] + sum(_json_bytes(m) for m in decision["messages"])
        if total > cfg.max_episode_bytes:
            raise EpisodeLimit(
                f"hook {hook} took the episode's messages to {total} bytes; "
                f"an episode may hold at most {cfg.max_episode_bytes}"
            )
        used[0], used[1] = actions, total

    async def _max_tokens(
        self, ep: Episode, tools: list[dict[str, Any]] | None, used: EpisodeTokens
    ) -> tuple[int, int | None]:
        """The next call's ``max_tokens`` under the episode's budget (see the module doc; < 1 = spent)
        and the prompt tokens it assumed (None: no limit needed them)."""
        sampling = self.sampling
        max_model_len = getattr(self.client, "max_model_len", None)
        if sampling.episode_tokens is None and sampling.episode_window is None and max_model_len is None:
            return sampling.max_tokens, None
        prompt = await self.client.count_prompt_tokens(ep.messages, tools, sampling)
        if prompt is None:
            if used.last_prompt > 0:  # the server counted the last prompt: add what came since, bounded
                prompt = (
                    used.last_prompt
                    + used.last_completion
                    + MESSAGE_FRAMING_TOKENS
                    + message_tokens_upper_bound(ep.messages[used.covered_messages :])
                )
            else:  # nothing counted yet: the whole prompt, bounded from above
                prompt = message_tokens_upper_bound(ep.messages) + len(json.dumps(tools or []).encode("utf-8"))
        limit, _ = call_max_tokens(
            sampling,
            generated=ep.completion_tokens,
            prompt_tokens=prompt,
            first_prompt=used.first_prompt,
            max_model_len=max_model_len,
        )
        return limit, prompt

    async def _model(
        self, ep: Episode, tools: list[dict[str, Any]] | None, used: EpisodeTokens, first: SharedFirstTurn | None = None
    ) -> dict[str, Any] | None:
        """One model call; None when the episode's token budget leaves nothing for it."""
        if not ep.messages:
            raise EpisodeError("the harness asked for a model turn with no messages")
        max_tokens, assumed_prompt = await self._max_tokens(ep, tools, used)
        if max_tokens < 1:
            return None
        sampling = self.sampling
        if max_tokens != sampling.max_tokens:
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens)
        shared = await first.take(self.client, ep.messages, tools, sampling, ep.sample) if first is not None else None
        if shared is None:
            seed = self._seed(ep.item_id, ep.sample, ep.turns)
            if seed is not None:
                sampling = dataclasses.replace(sampling, seed=seed)
            result = await self.client.chat(ep.messages, sampling, n=1, tools=tools)
            completion = result.completions[0]
        else:
            result, completion = shared
        ep.model = getattr(self.client, "model", ep.model)
        ep.turns += 1
        ep.prompt_tokens += result.prompt_tokens
        ep.completion_tokens += completion.completion_tokens
        ep.inference_seconds += result.latency_s
        message = dict(completion.message)
        message["role"] = "assistant"
        self._used.setdefault(id(ep), [0, 0])[1] += _json_bytes(message)
        ep.messages.append(message)
        if used.first_prompt is None:  # the window counts from here (a server without usage: the estimate)
            used.first_prompt = result.prompt_tokens or assumed_prompt
        used.last_prompt, used.last_completion = result.prompt_tokens, completion.completion_tokens
        used.covered_messages = len(ep.messages)
        step = {
            "type": "model",
            "turn": ep.turns,
            "message_index": len(ep.messages) - 1,
            "finish_reason": completion.finish_reason,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "max_tokens": max_tokens,
            "latency_s": round(result.latency_s, 6),
        }
        if shared is not None:
            step["shared_n"] = len(result.completions)  # one request (one prefill) for this many episodes
        if self.config.record_token_ids and completion.token_ids is not None:
            step["token_ids"] = completion.token_ids
        ep.steps.append(step)
        return {**message, "finish_reason": completion.finish_reason}

    def _seed(self, item_id: str, sample: int | None, turn: int) -> int | None:
        """The seed of one model call (None when the runner is unseeded); ``sample`` None: the shared
        first turn of all the item's samples (its completion ``j`` is sample ``j``'s)."""
        if self.config.seed is None:
            return None
        return call_seed(self.config.seed, item_id, "shared" if sample is None else sample, turn)

    async def _execute(self, env: Environment, ep: Episode, actions: list[dict[str, Any]]):
        results: list[dict[str, Any]] = []
        env_done = False
        for action in actions:
            t0 = time.perf_counter()
            if action["kind"] == "env":
                step = env.step(action["action"])
                try:
                    result = step.harness_result()  # the environment service answers with the same rule
                except ValueError as exc:  # a domain bug: fail loudly
                    raise EpisodeError(str(exc)) from exc
                info = _jsonable(step.info)
                graded = [str(g) for g in step.graded if g]
                env_done = env_done or step.done
            else:
                result, info, graded = await self._tool(env, action), {}, []
            seconds = time.perf_counter() - t0
            ep.env_seconds += seconds
            record = {"type": "action", "action": action, "result": result, "seconds": round(seconds, 6)}
            if info:
                record["info"] = info
            if graded:
                record["graded"] = graded
            ep.steps.append(record)
            results.append(result)
            if env_done:
                break
        return results, env_done

    async def _tool(self, env: Environment, action: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = {
            "kind": "tool",
            "name": action["name"],
            "id": action.get("id"),
            "content": "",
            "error": None,
        }
        try:
            content = await asyncio.wait_for(
                asyncio.to_thread(env.call_tool, action["name"], action.get("arguments") or {}),
                self.config.tool_timeout_s,
            )
            result["content"] = content if isinstance(content, str) else json.dumps(content)
        except DomainError as exc:
            result["error"] = _one_line(exc)
        except TimeoutError:
            result["error"] = f"tool {action['name']} timed out after {self.config.tool_timeout_s:g} s"
        return result


class SharedFirstTurn:
    """The first model call of one item's ``n`` episodes as one ``chat(n=n)`` request.

    The first episode to get there sends its prompt with ``n``; every episode whose first prompt (and
    tools) equals it takes the completion of its own sample index (so which episode gets which
    completion does not depend on the order they arrive in). An episode with a different first prompt
    (a harness whose ``start`` is random) gets None and makes its own request; the completion it would
    have taken goes unused. ``seed``: the request's seed (None: unseeded)."""

    def __init__(self, n: int, seed: int | None = None):
        self.n = n
        self.seed = seed
        self._prompt: tuple[list[dict[str, Any]], list[dict[str, Any]] | None] | None = None
        self._request: asyncio.Task[ChatResult] | None = None
        self._taken: set[int] = set()

    async def take(
        self,
        client: InferenceClient,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
        index: int,
    ) -> tuple[ChatResult, Completion] | None:
        if self._request is None:
            self._prompt = (list(messages), tools)
            if self.seed is not None:
                sampling = dataclasses.replace(sampling, seed=self.seed)
            # a task of its own: the episode that sent it may end (cancelled) while others still wait on it
            self._request = asyncio.ensure_future(client.chat(self._prompt[0], sampling, n=self.n, tools=tools))
        elif self._prompt != (messages, tools):
            return None
        if not 0 <= index < self.n or index in self._taken:
            return None
        self._taken.add(index)
        result = await asyncio.shield(self._request)
        if len(result.completions) <= index:
            raise InferenceError(f"asked for {self.n} completions, the backend answered {len(result.completions)}")
        return result, result.completions[index]


def _json_bytes(value: Any) -> int:
    """UTF-8 bytes of a JSON value as the trace stores it."""
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


def _one_line(exc: BaseException) -> str:
    text = str(exc).replace("\n", " ").strip() or type(exc).__name__
    return text[:1000]


def _jsonable(value: Any) -> Any:
    """Domain values must survive JSON; fail loudly (a domain bug) if they do not."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise EpisodeError(f"the environment returned a value that is not JSON: {exc}") from exc


async def run_episodes(
    domain: Domain,
    harness_path: Path,
    client: InferenceClient,
    items: Iterable[dict[str, Any]],
    sampling: SamplingParams,
    *,
    k: int = 1,
    config: RunnerConfig | None = None,
    limits: SandboxLimits | None = None,
    traces: Path | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    processes: int | None = None,
) -> list[Episode]:
    """One call: start the harness processes for ``harness_path``, run ``k`` episodes per item, stop them.
    ``traces``: a JSON-lines file the episodes are appended to as they finish (buffered, flushed at
    most every ``TRACE_FLUSH_S``: a flush per episode is a syscall on the event loop per episode).
    ``processes``: harness processes in the pool (default ``whale.harness.process.default_processes()``)."""
    config = config or RunnerConfig(harness_label=str(harness_path))
    with contextlib.ExitStack() as stack:
        out = None
        if traces is not None:
            traces.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(traces.open("a", encoding="utf-8", buffering=1 << 20))
        flushed = time.monotonic()

        def sink(episode: Episode) -> None:
            nonlocal flushed
            if out is not None:
                out.write(episode.to_json() + "\n")
                if time.monotonic() - flushed >= TRACE_FLUSH_S:
                    out.flush()
                    flushed = time.monotonic()
            if on_episode is not None:
                on_episode(episode)

        async with HarnessPool(harness_path, domain.allowed_imports, limits, processes) as harness:
            runner = EpisodeRunner(domain, harness, client, sampling, config)
            return await runner.run(items, k=k, on_episode=sink)
