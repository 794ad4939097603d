"""The runtime's handle on one sandboxed harness process, shared by many concurrent episodes.

Requests carry ids; one reader task matches answers to waiting futures, so hundreds of episodes
can wait on the same process. A hook that overruns its wall timeout gets the process killed and
restarted (its episode fails); other requests that were in flight at that moment are sent again
to the new process once (hooks are functions of their arguments and ``state``, so re-sending is
safe). Everything the harness answers is checked here before the runtime uses it: it is untrusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Any

from whale.harness import launch

log = logging.getLogger(__name__)

_ROLES = frozenset({"system", "user", "assistant", "tool"})


class HarnessError(RuntimeError):
    """The harness failed: it would not load, a hook raised or timed out, or it answered nonsense."""


class HarnessLoadError(HarnessError):
    """The harness file did not load in the sandbox (the message names the cause and the line)."""


class _HookTimeout(Exception):
    """Internal: a call's timer fired before its answer came."""


class _Collateral(HarnessError):
    """The process died because of another request; this one may be re-sent."""


@dataclasses.dataclass(frozen=True)
class HarnessInfo:
    """What the harness declared at load time."""

    max_turns: int
    tools: list[dict[str, Any]] | None
    constants: dict[str, Any]


class HarnessProcess:
    """``async with HarnessProcess(path, allowed) as h: decision, state = await h.call(...)``."""

    def __init__(
        self,
        path: Path,
        allowed_imports: frozenset[str] | set[str],
        limits: launch.SandboxLimits | None = None,
        max_restarts: int = 5,
    ):
        self.path = Path(path).resolve()
        self.allowed_imports = frozenset(allowed_imports)
        #: resource limits and ``isolation`` level (``spec.execution.sandbox.isolation``) of the process
        self.limits = limits or launch.SandboxLimits()
        self.max_restarts = max_restarts
        self.restarts = 0
        self.info: HarnessInfo | None = None
        self._proc: launch.Spawned | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._stderr_task: asyncio.Task[None] | None = None
        self._stderr_tail = bytearray()
        self._start_lock = asyncio.Lock()
        self._outbox: list[tuple[launch.Spawned, bytes]] = []
        self._flush_scheduled = False
        self._closed = False

    # ----- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> HarnessProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> HarnessInfo:
        """Start the process (idempotent); a process that died or was killed is restarted (counted)."""
        if self.info is not None and (self._proc is None or self._proc.returncode is not None):
            await self._restart()
            assert self.info is not None  # noqa: S101 - set by _restart
            return self.info
        async with self._start_lock:
            if self._proc is not None and self._proc.returncode is None:
                assert self.info is not None  # noqa: S101 - set together with _proc
                return self.info
            if self._closed:
                raise HarnessError("harness process is closed")
            self.info = await self._spawn()
            return self.info

    async def _spawn(self) -> HarnessInfo:
        if not self.path.is_file():
            raise HarnessLoadError(f"harness file {self.path} does not exist")
        self._stderr_tail.clear()
        try:
            spawned = await launch.spawn_worker(self.path, self.allowed_imports, self.limits)
        except launch.IsolationUnavailableError:
            raise  # the host's fault, not the harness's: the phase fails (the message names the spec field)
        except Exception as exc:  # the sandbox's own setup errors, re-raised typed
            raise HarnessLoadError(f"{self.path.name}: the sandbox did not start: {exc}") from exc
        self._proc = spawned
        self._stderr_task = asyncio.create_task(self._drain_stderr(spawned))
        try:
            line = await asyncio.wait_for(spawned.stdout.readline(), self.limits.start_timeout_s)
            hello = json.loads(line) if line else None
        except TimeoutError:
            await self._kill()
            raise HarnessLoadError(
                f"{self.path.name}: did not load within {self.limits.start_timeout_s:.0f} s"
            ) from None
        except ValueError:
            hello = None
        if not isinstance(hello, dict) or not hello.get("ready"):
            await self._kill()
            reason = hello.get("message") if isinstance(hello, dict) else None
            raise HarnessLoadError(f"{self.path.name}: {reason or 'failed to start: ' + self.stderr_tail()}")
        self._reader = asyncio.create_task(self._read_answers(spawned))
        try:
            info = _check_info(await self._request("describe", {}, self.limits.start_timeout_s))
        except HarnessError as exc:
            await self._kill()
            raise HarnessLoadError(f"{self.path.name}: {exc}") from exc
        log.debug("harness %s started (%s)", self.path.name, spawned.isolation)
        return info

    @property
    def isolation(self) -> dict[str, Any]:
        """The isolation of the running process: ``level`` (spec.execution.sandbox.isolation) and what the
        launcher achieved (empty when not running)."""
        if self._proc is None:
            return {}
        return dict(self._proc.isolation)

    async def aclose(self) -> None:
        self._closed = True
        await self._kill()

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        tasks = [t for t in (self._reader, self._stderr_task) if t is not None and t is not asyncio.current_task()]
        self._reader = self._stderr_task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        if proc is not None:
            await proc.kill()
        self._fail_pending(_Collateral("the harness process was stopped"))

    def stderr_tail(self) -> str:
        return self._stderr_tail.decode("utf-8", "replace").strip()[-2000:]

    async def _drain_stderr(self, proc: launch.Spawned) -> None:
        with contextlib.suppress(OSError):
            while chunk := await proc.stderr.read(65536):
                self._stderr_tail += chunk
                del self._stderr_tail[: max(0, len(self._stderr_tail) - self.limits.stderr_tail_bytes)]

    async def _read_answers(self, proc: launch.Spawned) -> None:
        reason = "harness process exited"
        try:
            while line := await proc.stdout.readline():
                answer = json.loads(line)
                future = self._pending.pop(answer.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except (ValueError, asyncio.LimitOverrunError, OSError) as exc:
            reason = f"harness process sent an unreadable answer ({exc})"
        tail = self.stderr_tail().splitlines()[-1:] or [""]
        self._fail_pending(_Collateral(f"{reason} (exit code {proc.returncode}) {tail[0]}".strip()))

    def _fail_pending(self, exc: HarnessError) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(exc)

    # ----- calls ------------------------------------------------------------------------------------

    async def call(
        self, hook: str, args: dict[str, Any], state: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run ``hook`` in the harness process; returns (checked decision, new state)."""
        for attempt in (0, 1):
            try:
                return await self._call_once(hook, args, state)
            except _Collateral:
                if attempt == 1:
                    raise
                await self._restart()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _restart(self) -> None:
        async with self._start_lock:
            if self._proc is not None and self._proc.returncode is None:
                return
            if self._closed:
                raise HarnessError("harness process is closed")
            if self._proc is None or not self._proc.idle_closed:  # an idle connection the host closed is no failure
                if self.restarts >= self.max_restarts:
                    raise HarnessError(f"harness process died {self.restarts} times; giving up")
                self.restarts += 1
            await self._kill()
            self.info = await self._spawn()

    async def _call_once(
        self, hook: str, args: dict[str, Any], state: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._proc is None or self._proc.returncode is not None:
            await self._restart()
        answer = await self._request(hook, {**args, "state": state}, self.limits.hook_timeout_s)
        if not isinstance(answer, dict) or "decision" not in answer:
            raise HarnessError(f"hook {hook}: malformed answer from the harness process")
        return check_decision(answer.get("decision"), hook), _check_state(answer.get("state"), hook)

    def _expire(self, rid: int) -> None:
        future = self._pending.pop(rid, None)
        if future is not None and not future.done():
            future.set_exception(_HookTimeout())

    def _flush(self) -> None:
        self._flush_scheduled = False
        entries, self._outbox = self._outbox, []
        proc = self._proc
        data = b"".join(line for owner, line in entries if owner is proc)
        if proc is None or not data or proc.stdin.is_closing():
            return  # lines for a process that is gone: its requests were failed when it went
        try:
            proc.stdin.write(data)
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            log.warning("harness process pipe closed while writing")

    async def _request(self, fn: str, kwargs: dict[str, Any], timeout_s: float) -> Any:
        """One call over the pipe; returns the function's result or raises HarnessError."""
        proc = self._proc
        if proc is None:
            raise _Collateral("harness process is not running")
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        line = json.dumps({"id": rid, "fn": fn, "args": [], "kwargs": kwargs}) + "\n"
        self._outbox.append((proc, line.encode("utf-8")))
        if not self._flush_scheduled:  # one write per event-loop iteration, however many episodes asked
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        # one timer per call (cheaper than wait_for's extra task; thousands of hooks per second)
        timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, rid)
        try:
            answer = await future
        except _HookTimeout:
            log.warning("harness call %s exceeded %.1f s; restarting the process", fn, timeout_s)
            if self._proc is proc:
                await self._kill()
            raise HarnessError(f"hook {fn} did not answer within {timeout_s:g} s") from None
        finally:
            timer.cancel()
        if not answer.get("ok"):
            raise HarnessError(f"hook {fn} failed: {_text(answer.get('message') or answer.get('error_type'))}")
        result = answer.get("result")
        if isinstance(result, dict) and "error" in result:  # the worker reports harness failures as values
            raise HarnessError(f"hook {fn} failed: {_text(result['error'])}")
        return result


def _text(value: Any, limit: int = 1000) -> str:
    """An untrusted message as one bounded line."""
    return str(value).replace("\n", " ")[:limit]


def _check_info(info: Any) -> HarnessInfo:
    """What ``describe`` answered (untrusted), checked."""
    if not isinstance(info, dict) or not isinstance(info.get("constants"), dict):
        raise HarnessError("describe: malformed answer from the harness process")
    max_turns, tools = info.get("max_turns"), info.get("tools")
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
        raise HarnessError(f"describe: MAX_TURNS must be an int >= 1, got {max_turns!r:.100}")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise HarnessError("describe: TOOLS must be a list of OpenAI function schemas (dicts) or None")
    return HarnessInfo(max_turns=max_turns, tools=tools, constants=info["constants"])


def _check_state(state: Any, hook: str) -> dict[str, Any]:
    if not isinstance(state, dict):
        raise HarnessError(f"hook {hook} left state as {type(state).__name__}; it must stay a dict")
    return state


def check_decision(decision: Any, hook: str) -> dict[str, Any]:
    """Validate a hook's answer (untrusted) and return it normalised; raise HarnessError naming the fault."""
    if not isinstance(decision, dict):
        raise HarnessError(f"hook {hook} returned {type(decision).__name__}; return Decision(...)")
    messages = decision.get("messages") or []
    actions = decision.get("actions") or []
    if not isinstance(messages, list) or not isinstance(actions, list):
        raise HarnessError(f"hook {hook}: Decision messages and actions must be lists")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise HarnessError(f"hook {hook}: message {i} needs a role in {sorted(_ROLES)}")
        if not isinstance(message.get("content", ""), str | None):
            raise HarnessError(f"hook {hook}: message {i} content must be a string")
    for i, action in enumerate(actions):
        kind = action.get("kind") if isinstance(action, dict) else None
        if kind == "env":
            if "action" not in action:
                raise HarnessError(f"hook {hook}: env action {i} has no 'action'")
        elif kind == "tool":
            if not isinstance(action.get("name"), str) or not isinstance(action.get("arguments", {}), dict):
                raise HarnessError(f"hook {hook}: tool action {i} needs a string name and dict arguments")
        else:
            raise HarnessError(f"hook {hook}: action {i} needs kind 'env' or 'tool', got {kind!r}")
    return {"messages": messages, "actions": actions, "done": bool(decision.get("done", False))}


def default_processes() -> int:
    """Harness processes per pool: hooks of many episodes arrive in bursts, one process serves them
    one by one; a few processes (not more than the CPUs) take the queueing out of every turn."""
    return max(1, min(4, (os.cpu_count() or 1)))


class HarnessPool:
    """Several :class:`HarnessProcess` workers of one harness file behind the same interface.

    Hooks are functions of their arguments and ``state``, so any worker can answer any call; each
    call goes to the worker with the fewest calls in flight."""

    def __init__(
        self,
        path: Path,
        allowed_imports: frozenset[str] | set[str],
        limits: launch.SandboxLimits | None = None,
        processes: int | None = None,
    ):
        count = processes or default_processes()
        self.workers = [HarnessProcess(path, allowed_imports, limits) for _ in range(count)]
        self.path = self.workers[0].path
        self._in_flight = [0] * count

    async def __aenter__(self) -> HarnessPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> HarnessInfo:
        """Start every worker. Raises :class:`~whale.harness.launch.IsolationUnavailableError` when
        the host cannot isolate them (see ``spec.execution.sandbox.isolation``), HarnessLoadError when the
        harness does not load."""
        started = await asyncio.gather(*(w.start() for w in self.workers), return_exceptions=True)
        infos = [result for result in started if not isinstance(result, BaseException)]
        if len(infos) < len(started):
            # every start has ended (a bare gather raises at the first failure while the others still spawn, and what
            # they spawn after the close would be left running): now close them all, then raise the first failure
            await self.aclose()
            raise next(result for result in started if isinstance(result, BaseException))
        return infos[0]

    @property
    def info(self) -> HarnessInfo | None:
        return self.workers[0].info

    @property
    def isolation(self) -> dict[str, Any]:
        return {**self.workers[0].isolation, "processes": len(self.workers)}

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers)

    async def call(
        self, hook: str, args: dict[str, Any], state: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        index = min(range(len(self.workers)), key=self._in_flight.__getitem__)
        self._in_flight[index] += 1
        try:
            return await self.workers[index].call(hook, args, state)
        finally:
            self._in_flight[index] -= 1

    async def aclose(self) -> None:
        await asyncio.gather(*(w.aclose() for w in self.workers))
