"""The egress proxy: an untrusted sandboxed program's one way out, to the host names an allow-list names.

A sandbox with ``Isolation(egress_socket=PATH)`` has its own network namespace with loopback only; a relay inside it
(started by the sandbox's init before the program, :mod:`whale.sandbox._boot`) listens on
``127.0.0.1:`` :data:`~whale.sandbox.policy.EGRESS_RELAY_PORT` and carries each connection's bytes to the Unix socket
``PATH``, bind-mounted into the sandbox. This module serves that socket, outside the sandbox, in the launcher's
process: an HTTP ``CONNECT`` proxy that opens a TCP connection only for ``CONNECT host:port`` where the policy
(:class:`whale.core.egress.EgressPolicy`) allows the name and port, resolves the name here, refuses it if any address
is not public (unless the name is a private opt-in), and dials the very address it checked (no second lookup, so DNS
rebinding gains nothing). Anything else (plain HTTP, a malformed or oversized request head, an IP literal) is
answered with an error status and closed. The program gets ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` pointing at
the relay. The same design as Anthropic's sandbox-runtime for Claude Code (a network namespace, a proxy on a Unix
socket, a domain allow-list); no code of it is used.

Why our own ~200 lines rather than a proxy library: what is needed is small and exact (listen on a Unix socket, one
method, a per-name check of the resolved address before dialling it, bounded heads, connection counts and idle
times, stop with the session); the libraries that do this (proxy.py, mitmproxy) are whole servers with plugin
systems, their own processes and TLS interception, far more surface than this wall wants, and none checks the
resolved address before connecting without a plugin of its own. Stdlib asyncio only.

Bounded everything: the request head (:data:`HEAD_BYTES`, :data:`HEAD_TIMEOUT_S`), the name's resolution and the
connect (:data:`RESOLVE_TIMEOUT_S`, :data:`CONNECT_TIMEOUT_S`), concurrent tunnels (``max_connections``), a tunnel's
idle time (``idle_timeout_s``), and its lifetime: :meth:`EgressProxy.close` (the end of the agent's session) ends
every tunnel.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from whale.core.egress import EgressPolicy, EgressRefused

log = logging.getLogger(__name__)

#: the largest request head read (``CONNECT host:port HTTP/1.1`` and its headers)
HEAD_BYTES = 8192
#: seconds to send the request head, to resolve the name, to connect
HEAD_TIMEOUT_S = 10.0
RESOLVE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
#: concurrent tunnels at most (more are answered 503)
MAX_CONNECTIONS = 64
#: a tunnel with no byte either way for this long is closed (an agent's streamed model call sends at least its
#: keep-alive events well within it)
IDLE_TIMEOUT_S = 600.0
#: seconds :meth:`EgressProxy.start` waits for the server thread, :meth:`EgressProxy.close` for it to end
START_TIMEOUT_S = 10.0
CHUNK_BYTES = 1 << 16
#: decisions kept for the session's record (:attr:`EgressProxy.decisions`)
MAX_DECISIONS = 1000

#: (host, port) -> the addresses it resolves to
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to here, outside the sandbox (the system resolver)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class EgressProxyError(RuntimeError):
    """The proxy could not start (so the sandbox it guards must not either)."""


class _End(Exception):
    """A tunnel ends: an error on one side, or it sat idle."""


class EgressProxy:
    """The ``CONNECT`` proxy on a Unix socket, served by its own thread and event loop while the session runs.

    Args:
        policy: the allow-list.
        max_connections, idle_timeout_s: the bounds above.
        resolver: how names are resolved (default :func:`resolve`).
    """

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        resolver: Resolver = resolve,
    ):
        if max_connections < 1 or idle_timeout_s <= 0:
            raise ValueError("EgressProxy: max_connections must be >= 1 and idle_timeout_s > 0")
        self.policy = policy
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.resolver = resolver
        #: one line per request: what was asked and what was decided (bounded)
        self.decisions: collections.deque[str] = collections.deque(maxlen=MAX_DECISIONS)
        self._dir: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._tunnels: set[asyncio.Task[Any]] = set()

    @property
    def socket_path(self) -> str:
        if self._dir is None:
            raise RuntimeError("the egress proxy is not started")
        return os.path.join(self._dir, "egress.sock")

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Serve the socket (in a directory only this user can enter; the socket itself is bind-mounted into the
        sandbox, where the relay's uid must be able to connect). Returns once it listens."""
        self._dir = tempfile.mkdtemp(prefix="whale-egress-")
        self._thread = threading.Thread(target=self._serve, name="whale-egress-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._error is not None:
            self.close()
            raise EgressProxyError(f"the egress proxy did not start: {self._error!r}")

    def close(self) -> None:
        """End every tunnel and the server; bounded."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(START_TIMEOUT_S)
            if self._thread.is_alive():
                log.error("the egress proxy's thread did not end within %.0f s", START_TIMEOUT_S)
            self._thread = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start(), which raises it
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_unix_server(self._client, self.socket_path)
        os.chmod(self.socket_path, 0o666)  # its directory is 0700: only the bind mount reaches it
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self._tunnels):
                task.cancel()
            await asyncio.gather(*self._tunnels, return_exceptions=True)
            await server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tunnels.add(task)
        try:
            if len(self._tunnels) > self.max_connections:
                await self._answer(writer, 503, f"more than {self.max_connections} connections at once")
                return
            await self._tunnel(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass  # the sandbox side went away
        finally:
            writer.close()
            if task is not None:
                self._tunnels.discard(task)

    async def _answer(self, writer: asyncio.StreamWriter, status: int, why: str) -> None:
        self.decisions.append(f"refused ({status}): {why}")
        log.info("egress refused (%d): %s", status, why)
        body = f"whale egress proxy: {why}\n".encode()
        reason = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed", 502: "Bad Gateway"}.get(
            status, "Service Unavailable"
        )
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(OSError):
            await writer.drain()

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            await self._answer(writer, 400, "no complete request head")
            return
        if len(head) > HEAD_BYTES:
            await self._answer(writer, 400, f"request head over {HEAD_BYTES} bytes")
            return
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._answer(writer, 400, "malformed request line")
            return
        method, authority = parts[0], parts[1]
        if method != "CONNECT":
            await self._answer(writer, 405, f"{method[:16]} refused: only CONNECT (HTTPS) goes out")
            return
        try:
            host, port = self.policy.target(authority)
            try:
                found = await asyncio.wait_for(self.resolver(host, port), RESOLVE_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                await self._answer(writer, 502, f"CONNECT {host}:{port}: cannot resolve the name ({exc})")
                return
            addresses = [self.policy.address(host, a) for a in found]  # any non-public one refuses the name
        except EgressRefused as exc:
            await self._answer(writer, 403, str(exc)[:300])
            return
        upstream = None
        for address in addresses:
            try:
                upstream = await asyncio.wait_for(asyncio.open_connection(str(address), port), CONNECT_TIMEOUT_S)
                break
            except (OSError, TimeoutError):
                continue
        if upstream is None:
            await self._answer(
                writer, 502, f"CONNECT {host}:{port}: no address of {[str(a) for a in addresses]} answers"
            )
            return
        self.decisions.append(f"allowed: {host}:{port} -> {address}")
        log.info("egress allowed: %s:%d -> %s", host, port, address)
        up_reader, up_writer = upstream
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            activity = [time.monotonic()]
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._copy(reader, up_writer, activity))
                    group.create_task(self._copy(up_reader, writer, activity))
            except* _End:
                pass
        finally:
            up_writer.close()

    async def _copy(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, activity: list[float]) -> None:
        """One direction of a tunnel until its end of file (passed on as a half-close), an error or the idle time."""
        while True:
            try:
                data = await asyncio.wait_for(src.read(CHUNK_BYTES), self.idle_timeout_s)
            except TimeoutError:
                if time.monotonic() - activity[0] >= self.idle_timeout_s:
                    raise _End from None
                continue  # the other direction was busy meanwhile
            except OSError:
                raise _End from None
            if not data:
                if dst.can_write_eof():
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                return
            activity[0] = time.monotonic()
            try:
                dst.write(data)
                await dst.drain()
            except OSError:
                raise _End from None
