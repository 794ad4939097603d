"""The lean HTTP/1.1 transport against raw asyncio servers on loopback: keep-alive reuse, chunked
bodies, a server that closes idle connections, timeouts and refused connections as httpx errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from whale.inference.server import free_port
from whale.inference.transport import LeanHTTPTransport


async def _serve(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


@pytest.fixture()
async def counting_server() -> AsyncIterator[tuple[str, list[int]]]:
    """Answers each request with its JSON body echoed, Content-Length or chunked (by ?chunked), and
    closes a connection after its second request. Records one entry per accepted connection."""
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        for _ in range(2):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            body = await reader.readexactly(length)
            if b"chunked" in head.split(b"\r\n")[0]:
                half = len(body) // 2
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + f"{half:x}\r\n".encode() + body[:half] + b"\r\n"
                             + f"{len(body) - half:x}\r\n".encode() + body[half:] + b"\r\n0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    yield url, connections
    server.close()
    await server.wait_closed()


async def test_keep_alive_chunked_and_server_side_close(counting_server: tuple[str, list[int]]) -> None:
    url, connections = counting_server
    async with httpx.AsyncClient(transport=LeanHTTPTransport(4)) as client:
        for i in range(5):  # the server closes each connection after two requests: the transport reconnects
            response = await client.post(f"{url}/echo{'?chunked' if i % 2 else ''}", json={"i": i})
            assert response.status_code == 200 and json.loads(response.content) == {"i": i}
    assert len(connections) == 3


async def test_read_timeout_and_refused_connection_are_httpx_errors() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(2)
        writer.close()

    server, url = await _serve(silent)
    try:
        async with httpx.AsyncClient(transport=LeanHTTPTransport(4), timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"{url}/x", json={})
            with pytest.raises(httpx.ConnectError):
                await client.post(f"http://127.0.0.1:{free_port()}/x", json={})
    finally:
        server.close()
        await server.wait_closed()


async def test_https_is_refused_with_a_clear_error() -> None:
    async with httpx.AsyncClient(transport=LeanHTTPTransport(4)) as client:
        with pytest.raises(httpx.UnsupportedProtocol, match="plain http only"):
            await client.get("https://127.0.0.1:1/x")
