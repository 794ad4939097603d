"""The operator's requests to the API server, straight: one kept-open connection per thread.

Why not urllib3's pool and ``http.client`` (the SDK's way): of a request's client CPU most went to urllib3's pool
handling and ``http.client``'s header writing and parsing (it parses every response's headers with the ``email``
package), about 0.25 ms a request here, and a reconcile sends two to four. Here the connection is still made by
urllib3, from the SDK's own pool settings (so TCP options, TLS, CA file or data, client certificate, ``verify_ssl``,
``tls_server_name`` and the hostname check are exactly what the SDK's configuration asks for), but the request is
written in one piece and the answer is read by httptools (llhttp, the parser of Node.js, in C): about a quarter of
the CPU (``benchmarks/kube_transport.py``).

A kept connection is reused only while it is idle and open: one that the server closed (or sent something unasked
on) is seen before the request, as urllib3 sees it, and one idle for longer than :data:`IDLE_S` is not reused at all
(the API server closes idle connections after 90 s). A request is never sent twice unless it is a ``GET``: one that
may have reached the server and got no answer raises :class:`ConnectionLost`, and the caller (a reconcile, retried
with a back-off) reads the world again before writing.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httptools
import urllib3

#: a kept connection idle for longer is closed rather than reused: the API server closes its idle connections after
#: 90 s (kube-apiserver's ``IdleTimeout``), and one it closes while a request is on its way fails that request
IDLE_S = 45.0
#: a response is read into this buffer, a piece at a time
_CHUNK = 64 * 1024


class ConnectionLost(ConnectionError):
    """The API server could not be reached, or closed the connection (or went silent past the deadline) before its
    whole answer came: a request other than a ``GET`` may or may not have been applied, so it is not sent again
    here."""


#: the headers that frame a body (without either, the body ends where the server closes the connection)
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


class _Answer:
    """httptools' callbacks for one response: its framing, its body and its end (the status is asked of the
    parser). An informational answer (1xx) before it is passed over; anything after it spoils the connection."""

    __slots__ = ("body", "done", "framed", "headed", "keep", "parser", "status", "trailing")

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.done = False
        self.framed = False
        self.headed = False
        #: the connection may carry the next request (asked when the headers are read: llhttp forgets at the end)
        self.keep = False
        #: bytes came after the answer (none was asked for): the connection is not used again
        self.trailing = False
        self.status = 0
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        if self.done:
            self.trailing = True

    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in _FRAMING:
            self.framed = True

    def on_headers_complete(self) -> None:
        if not self.done:
            self.headed = True
            self.keep = self.parser.should_keep_alive()
            self.status = self.parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        if not self.done:
            self.body.append(data)

    def on_message_complete(self) -> None:
        if self.done:
            return
        if self.status < 200:  # 100 Continue, 103 Early Hints: the answer is still to come
            self.framed = self.headed = False
            return
        self.done = True

    def ended_by_close(self) -> bool:
        """At the server's close: the answer is whole when its body was to end there (no length, not chunked)."""
        return self.headed and not self.framed


@dataclass
class _Connection:
    """One open connection (made by urllib3), owned by one thread."""

    conn: Any  # urllib3's HTTPConnection / HTTPSConnection, connected: its ``sock`` is what is spoken on
    thread: threading.Thread
    used_at: float = field(default_factory=time.monotonic)
    #: a request is on it (under :class:`Transport`'s lock): :meth:`Transport.close` leaves it to its thread
    busy: bool = False
    buffer: bytearray = field(default_factory=lambda: bytearray(_CHUNK))
    view: memoryview = field(init=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.buffer)

    def usable(self, now: float) -> bool:
        """Open, nothing unasked waiting on it (urllib3's own check: a server's close makes it readable), and not
        idle for so long that the server may close it under the next request."""
        return now - self.used_at < IDLE_S and bool(self.conn.is_connected)

    def close(self) -> None:
        self.conn.close()


class Transport:
    """Requests to one API server, each thread on its own kept-open connection.

    ``pool`` is the SDK's urllib3 connection pool for the server: connections are made as it makes them (its
    ``_new_conn``, with the pool's TLS and socket settings) and then spoken on directly; its queue is not used.
    """

    def __init__(self, pool: Any, base_path: str, host: str, timeout_s: float):
        self._pool = pool
        #: the path prefix of the configured host URL (a server behind a path, e.g. ``https://proxy/k8s/clusters/c``)
        self._base_path = base_path.rstrip("/")
        self._host = host
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[_Connection] = []
        #: :meth:`close` was called: no connection is kept after its request
        self._closed = False
        #: connections made so far (tests, benchmarks)
        self.opened = 0

    def close(self) -> None:
        """Close every idle connection now, and each one under a request when its request ends (never a socket
        another thread is reading: its number could be a new socket's by then). A request made afterwards still
        works, on a connection closed after it."""
        with self._lock:
            self._closed = True
            idle = [c for c in self._open if not c.busy]
            self._open = [c for c in self._open if c.busy]
        for conn in idle:
            conn.close()

    def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one request; :class:`ConnectionLost` when no whole answer came."""
        head = self._head(method, path, headers, body)
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        conn: _Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not conn.usable(time.monotonic()):
            self._drop(conn)
            conn = None
        reused = conn is not None
        if conn is None:
            conn = self._connect(deadline)
        try:
            return self._use(conn, head, body, deadline)
        except ConnectionLost:
            self._drop(conn)
            if not (reused and method == "GET"):
                raise
        # a kept connection that failed under a GET (closed by the server as it was sent): once more, on a new one
        conn = self._connect(deadline)
        try:
            return self._use(conn, head, body, deadline)
        except ConnectionLost:
            self._drop(conn)
            raise

    def _use(self, conn: _Connection, head: bytes, body: bytes | None, deadline: float) -> tuple[int, bytes]:
        """One exchange on ``conn``, marked busy meanwhile (:meth:`close`); after a close, not kept."""
        with self._lock:
            conn.busy = True
        try:
            return self._exchange(conn, head, body, deadline)
        finally:
            with self._lock:
                conn.busy = False
                closed = self._closed
            if closed:
                self._drop(conn)

    def _head(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> bytes:
        for part in (path, *headers, *headers.values()):
            if "\n" in part or "\r" in part:
                # a line break would end a header early and let the rest be read as headers (or a second
                # request): refuse it, never send it
                raise ValueError(f"refusing to send {method} {path!r}: a header or the path holds a line break")
        if " " in path:
            raise ValueError(f"refusing to send {method} {path!r}: a space in the path (quote it)")
        lines = [f"{method} {self._base_path}{path} HTTP/1.1", f"Host: {self._host}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")

    def _connect(self, deadline: float) -> _Connection:
        conn = self._pool._new_conn()  # NOTE: urllib3's own maker: the pool's TLS and socket settings, exactly
        conn.timeout = max(deadline - time.monotonic(), 0.001)
        try:
            conn.connect()
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # refused, unreachable, TLS verification failed
            conn.close()
            raise ConnectionLost(f"cannot connect to the API server {self._host}: {exc}") from exc
        made = _Connection(conn, threading.current_thread())
        self._local.conn = made
        with self._lock:
            self.opened += 1
            # the connections of threads that have ended are closed here (kopf's worker threads live on)
            gone = [c for c in self._open if not c.thread.is_alive()]
            self._open = [c for c in self._open if c.thread.is_alive()] + [made]
        for old in gone:
            old.close()
        return made

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            if conn in self._open:
                self._open.remove(conn)

    def _exchange(self, conn: _Connection, head: bytes, body: bytes | None, deadline: float) -> tuple[int, bytes]:
        sock: socket.socket = conn.conn.sock
        answer = _Answer()
        parser = answer.parser
        buffer, view = conn.buffer, conn.view
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(head + body if body is not None else head)
            while not answer.done:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                n = sock.recv_into(buffer)
                if not n:
                    if answer.ended_by_close():
                        break
                    raise ConnectionLost(f"the API server {self._host} closed the connection before its whole answer")
                try:
                    parser.feed_data(view[:n])
                except httptools.HttpParserError as exc:
                    if not answer.done:
                        raise ConnectionLost(
                            f"the API server {self._host} answered with a malformed response: {exc}"
                        ) from exc
                    answer.trailing = True  # the answer is whole; what came after it is not
        except ConnectionLost:
            raise
        except TimeoutError as exc:
            raise ConnectionLost(f"no whole answer from the API server {self._host} in time") from exc
        except OSError as exc:  # reset, broken pipe, a TLS error
            raise ConnectionLost(f"the connection to the API server {self._host} failed: {exc}") from exc
        if answer.done and answer.keep and not answer.trailing:
            conn.used_at = time.monotonic()
        else:  # ``Connection: close`` (or HTTP/1.0), or bytes after the answer: not used again
            self._drop(conn)
        return answer.status, b"".join(answer.body)
