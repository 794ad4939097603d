"""The test doubles' HTTP server stays quiet when a client resets its connection, and only then."""

from __future__ import annotations

import socket
import struct
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fixtures.http_double import DoubleHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _one_reset_request(server_class: type[ThreadingHTTPServer]) -> None:
    """A client that connects and resets at once, handled in this thread (no request thread to wait for)."""

    class InThisThread(server_class):  # type: ignore[misc,valid-type]
        def process_request(self, request: Any, client_address: Any) -> None:
            self.process_request_thread(request, client_address)

    server = InThisThread(("127.0.0.1", 0), _Handler)
    server.timeout = 10
    try:
        client = socket.create_connection(server.server_address[:2], timeout=10)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
        client.close()
        server.handle_request()
    finally:
        server.server_close()


def test_a_client_reset_prints_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    _one_reset_request(DoubleHTTPServer)
    assert "Traceback" not in capfd.readouterr().err


def test_the_standard_server_prints_one_for_the_same_reset(capfd: pytest.CaptureFixture[str]) -> None:
    _one_reset_request(ThreadingHTTPServer)
    assert "ConnectionResetError" in capfd.readouterr().err
