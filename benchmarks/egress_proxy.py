"""What the egress proxy costs a ``cli`` agent (``proposer.network: proxy`` against ``host``): connection set-up and
bulk transfer, each measured from inside a real sandbox to a loopback server outside it.

``host``: the sandbox shares the host's network and connects to the server directly. ``proxy``: the sandbox has
loopback only; the program connects to the relay on 127.0.0.1:3128 inside it, asks ``CONNECT localhost:PORT`` (the
name allow-listed, with the private opt-in, since the server is on loopback), and the proxy outside dials the server:
two extra hops (relay -> Unix socket -> proxy) and one name resolution per connection. Set-up is timed from
``connect()`` to the server's first byte; bulk is ``--mib`` MiB downloaded (the server sends) and uploaded (the
program sends), each over one connection.

    PYTHONPATH=. .venv/bin/python benchmarks/egress_proxy.py [--connections 200] [--mib 256] [--json OUT] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import socketserver
import statistics
import threading
from pathlib import Path

#: the program run in the sandbox: set-up times, then a download and an upload; one JSON line out
PROGRAM = r"""
import json, os, socket, sys, time
port, connections, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
proxy = os.environ.get("HTTPS_PROXY", "").removeprefix("http://")


def open_conn():
    if not proxy:
        return socket.create_connection(("127.0.0.1", port), timeout=30)
    host, _, relay = proxy.partition(":")
    s = socket.create_connection((host, int(relay)), timeout=30)
    s.sendall(b"CONNECT localhost:%d HTTP/1.1\r\n\r\n" % port)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            raise OSError("the proxy closed: %r" % head)
        head += chunk
    if b" 200 " not in head:
        raise OSError(head.decode())
    return s


def exact(s, n):
    got = 0
    while got < n:
        chunk = s.recv(min(1 << 20, n - got))
        if not chunk:
            break
        got += len(chunk)
    return got


setup = []
for _ in range(connections):
    t = time.perf_counter()
    s = open_conn()
    s.sendall(b"S 0\n")
    exact(s, 1)
    setup.append(time.perf_counter() - t)
    s.close()
s = open_conn()
t = time.perf_counter()
s.sendall(b"D %d\n" % size)
down = exact(s, size)
down_s = time.perf_counter() - t
s.close()
s = open_conn()
block = b"x" * (1 << 20)
t = time.perf_counter()
s.sendall(b"U %d\n" % size)
left = size
while left:
    left -= s.send(block[: min(left, len(block))])
ack = s.recv(64)
up_s = time.perf_counter() - t
s.close()
print(json.dumps({"setup_s": setup, "down_bytes": down, "down_s": down_s, "up_ack": ack.decode(), "up_s": up_s}))
"""


class _Handler(socketserver.StreamRequestHandler):
    """``S 0``: one byte back; ``D n``: n bytes back; ``U n``: read n bytes, answer their count."""

    def handle(self) -> None:
        op, n = self.rfile.readline().split()
        size = int(n)
        if op == b"S":
            self.wfile.write(b"!")
        elif op == b"D":
            block = b"y" * (1 << 20)
            left = size
            while left:
                self.wfile.write(block[: min(left, len(block))])
                left -= min(left, len(block))
        elif op == b"U":
            got = 0
            while got < size:
                chunk = self.rfile.read1(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
            self.wfile.write(str(got).encode())


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def run_variant(network: str, port: int, connections: int, size: int) -> dict:
    from whale.core.egress import EgressPolicy
    from whale.sandbox import Isolation, Limits, run_python
    from whale.sandbox.egress import EgressProxy

    limits = Limits(wall_s=300, cpu_s=300)
    args = [str(port), str(connections), str(size)]
    if network == "host":
        result = run_python(PROGRAM, args=args, isolation=Isolation(host_network=True), limits=limits)
    else:
        with EgressProxy(EgressPolicy((f"localhost:{port}",), ("localhost",))) as proxy:
            result = run_python(PROGRAM, args=args, isolation=Isolation(egress_socket=proxy.socket_path), limits=limits)
    if not result.outcome.ok:
        raise RuntimeError(f"{network}: {result.describe()}: {result.stderr[-2000:]}")
    raw = json.loads(result.stdout.strip().splitlines()[-1])
    if raw["down_bytes"] != size or raw["up_ack"] != str(size):
        raise RuntimeError(f"{network}: bytes lost: {raw['down_bytes']} down, {raw['up_ack']} up of {size}")
    mib = size / (1 << 20)
    return {
        "network": network,
        "connections": connections,
        "setup_median_ms": round(statistics.median(raw["setup_s"]) * 1000, 3),
        "setup_p90_ms": round(statistics.quantiles(raw["setup_s"], n=10)[-1] * 1000, 3),
        "download_mib_s": round(mib / raw["down_s"], 1),
        "upload_mib_s": round(mib / raw["up_s"], 1),
        "bytes": size,
        "setup_s": raw["setup_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="10 connections, 4 MiB (CI)")
    args = parser.parse_args()
    connections, mib = (10, 4) if args.smoke else (args.connections, args.mib)
    server = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        results = [run_variant(n, port, connections, mib << 20) for n in ("host", "proxy")]
    finally:
        server.shutdown()
        server.server_close()
    host, proxy = results
    report = {
        "connections": connections,
        "mib": mib,
        "cpus": len(os.sched_getaffinity(0)),
        "results": results,
        "compare": {
            "setup_added_ms": round(proxy["setup_median_ms"] - host["setup_median_ms"], 3),
            "download_ratio": round(proxy["download_mib_s"] / host["download_mib_s"], 3),
            "upload_ratio": round(proxy["upload_mib_s"] / host["upload_mib_s"], 3),
        },
    }
    text = json.dumps(report, indent=2)
    print(
        json.dumps(
            {k: v for k, v in report.items() if k != "results"}
            | {"results": [{k: v for k, v in r.items() if k != "setup_s"} for r in results]},
            indent=2,
        )
    )
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
