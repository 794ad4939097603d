"""The client CPU of one request to the API server, side by side: the operator's transport against the ways it could
have gone (issue #33).

Each variant sends the same merge PATCH of a ConfigMap to the Kubernetes API emulator on loopback (in a thread of
this process: its CPU is not the client thread's) over a kept-open connection, the body JSON-encoded and the answer
JSON-decoded, and is timed by ``time.thread_time()`` over ``--requests`` requests; the variants take turns, round
after round, so the machine's load falls on each alike. Variants:

* ``sdk_urllib3_pool``: the SDK's urllib3 pool for the server, ``urlopen`` with the client's headers (the operator's
  way before ``whale_operator.transport``);
* ``http_client``: a bare ``http.client.HTTPConnection`` kept open (the standard library's parser: ``email``);
* ``transport``: ``whale_operator.transport.Transport.request`` (a connection urllib3 made, httptools' parser);
* ``kube_client``: the whole ``KubeClient.request`` on it (the headers and the token, the status's typed errors);
* ``httpx``: an ``httpx.Client`` kept open.

    .venv/bin/python benchmarks/kube_transport.py [--requests 1000] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from tests.fixtures.kube import start_emulator

NS, NAME = "bench", "c"
PATH = f"/api/v1/namespaces/{NS}/configmaps/{NAME}"
CONTENT_TYPE = "application/merge-patch+json"


def variants(url: str) -> tuple[dict[str, Callable[[int], dict[str, Any]]], Callable[[], None]]:
    """Each variant's one request (the ``i``-th), and what closes them all."""
    from whale_operator.kube import REQUEST_TIMEOUT_S, KubeClient

    kube = KubeClient.from_environment()
    cfg = kube.api.configuration
    headers = {**kube.api.default_headers, "Accept": "application/json", "Content-Type": CONTENT_TYPE}
    for auth in cfg.auth_settings().values():
        if auth["in"] == "header" and auth["value"]:
            headers[auth["key"]] = auth["value"]
    pool = kube.api.rest_client.pool_manager.connection_from_url(cfg.host)
    transport = kube._transport
    if transport is None:
        raise SystemExit("the API server is reached through a proxy here: no direct transport to measure")
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=REQUEST_TIMEOUT_S)
    client = httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S)

    def body(i: int) -> bytes:
        return json.dumps({"data": {"i": str(i)}}).encode()

    def sdk_urllib3_pool(i: int) -> dict[str, Any]:
        resp = pool.urlopen("PATCH", PATH, body=body(i), headers=headers, assert_same_host=False)
        return dict(json.loads(resp.data))

    def http_client(i: int) -> dict[str, Any]:
        conn.request("PATCH", PATH, body=body(i), headers=headers)
        return dict(json.loads(conn.getresponse().read()))

    def own_transport(i: int) -> dict[str, Any]:
        _status, data = transport.request("PATCH", PATH, headers, body(i))
        return dict(json.loads(data))

    def kube_client(i: int) -> dict[str, Any]:
        return kube.request("PATCH", PATH, body={"data": {"i": str(i)}}, content_type=CONTENT_TYPE)

    def with_httpx(i: int) -> dict[str, Any]:
        return dict(client.patch(PATH, content=body(i), headers=headers).json())

    def close() -> None:
        conn.close()
        client.close()
        kube.close()

    return {
        "sdk_urllib3_pool": sdk_urllib3_pool,
        "http_client": http_client,
        "transport": own_transport,
        "kube_client": kube_client,
        "httpx": with_httpx,
    }, close


def measure(requests: int, rounds: int, workdir: Path) -> dict[str, list[float]]:
    """Per variant, each round's thread CPU per request (seconds)."""
    cluster, stop = start_emulator(workdir)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    try:
        cluster.api.create("v1", "namespaces", None, {"metadata": {"name": NS}})
        cluster.api.create("v1", "configmaps", NS, {"metadata": {"name": NAME}, "data": {"i": "0"}})
        calls, close = variants(cluster.url)
        try:
            per: dict[str, list[float]] = {name: [] for name in calls}
            for name, call in calls.items():  # warm: each connection open, each path's code loaded
                for i in range(20):
                    if call(i).get("metadata", {}).get("name") != NAME:
                        raise SystemExit(f"{name}: the PATCH did not answer with the ConfigMap")
            for _ in range(rounds):
                for name, call in calls.items():
                    started = time.thread_time()
                    for i in range(requests):
                        call(i)
                    per[name].append((time.thread_time() - started) / requests)
            return per
        finally:
            close()
    finally:
        cluster.api.close()
        stop.set()
        stop.thread.join(timeout=10)  # type: ignore[attr-defined]  # set by start_emulator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000, help="requests per variant per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the variants taking turns in each")
    ap.add_argument("--out", type=Path, help="write the raw JSON here (benchmarks/results/...)")
    args = ap.parse_args()
    if args.requests < 1 or args.rounds < 1:
        ap.error("--requests and --rounds must be at least 1")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        per = measure(args.requests, args.rounds, Path(tmp))
    summary = {
        name: {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}
        for name, values in per.items()
    }
    base = summary["sdk_urllib3_pool"]["median_s"]
    for name, s in summary.items():
        s["vs_sdk_urllib3_pool"] = s["median_s"] / base
        print(
            f"{name:18s} median {s['median_s'] * 1e3:.3f} ms/request  ({s['vs_sdk_urllib3_pool']:.2f} x the SDK pool)"
        )
    result = {
        "command": " ".join(["benchmarks/kube_transport.py", *sys.argv[1:]]),
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "load_average": {"start": load, "end": os.getloadavg()},
        "per_variant": summary,
        "raw_s": per,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
