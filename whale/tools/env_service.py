"""A domain's environment as an HTTP service, for the proposer's prototyping kit: ``POST /step`` plays a harness's
environment actions on a fresh episode of one of the run's D_harness tasks and answers what the harness's
``observe`` would get (:mod:`whale.tools.env_replay`, through the domain's own ``Environment.step``).

Run ``python -m whale.tools.env_service --domain chess_puzzles --items harness.jsonl [--verifier JSON]
[--host H] [--port P]``: ``--items`` is the D_harness split (JSON lines, the items ``Domain.load_split`` gives; a
cluster's init container fetches it, ``whale.domain.env_service``), ``--verifier`` the run's ``spec.experiment.verifier``
(chess: which moves solve). Request ``{"task": {...}, "actions": [...]}`` (the task as ``reset()`` gives it, a line of
the kit's ``tasks.jsonl``); response ``{"results", "unplayed"}``. A task not served (a test item, a made-up one) is
a 404, a malformed request a 4xx naming the field.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from whale.domain import DOMAIN_OPTIONS_FLAG
from whale.tools.env_replay import EnvReplay, ReplayRequestError, UnknownTaskError
from whale.tools.process import stop_process

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 * 1024
#: how long :func:`serve_locally` waits for the service's first health check
READY_WAIT_S = 60.0


def create_app(replay: EnvReplay) -> FastAPI:
    app = FastAPI(title="whale environment service", docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True, "domain": replay.domain.name, "tasks": len(replay.items)}

    @app.post("/step")
    async def step(request: Request) -> Any:
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return JSONResponse({"detail": f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}"}, 413)
        try:
            req = json.loads(body)
        except ValueError:
            return JSONResponse({"detail": 'body: not JSON; send {"task": TASK, "actions": [...]}'}, 422)
        if not isinstance(req, dict) or set(req) - {"task", "actions"}:
            return JSONResponse(
                {"detail": 'body: a JSON object {"task": TASK, "actions": [...]} and nothing else'}, 422
            )
        try:
            return await run_in_threadpool(replay.replay, req.get("task"), req.get("actions", []))
        except UnknownTaskError as exc:
            return JSONResponse({"detail": str(exc)}, 404)
        except ReplayRequestError as exc:
            return JSONResponse({"detail": str(exc)}, 422)

    return app


def load_replay(
    domain_name: str, items_path: Path, verifier_json: str | None, options_json: str | None = None
) -> EnvReplay:
    """The domain plugin, with the run's domain options and verifier, over the items of ``items_path``."""
    from whale import plugins
    from whale.core.spec import Verifier
    from whale.domain import for_run

    domain = for_run(plugins.load(domain_name), json.loads(options_json) if options_json else {})
    if verifier_json:
        domain.configure_verifier(Verifier.model_validate(json.loads(verifier_json)))
    lines = items_path.read_text("utf-8").splitlines()
    return EnvReplay(domain, [json.loads(line) for line in lines if line.strip()])


@contextlib.contextmanager
def serve_locally(
    domain: str,
    items: Sequence[Mapping[str, Any]],
    verifier: Mapping[str, Any],
    workdir: Path,
    options: Mapping[str, Any] | None = None,
) -> Iterator[str]:
    """The service on this machine's loopback for a local run's harness phase (a cluster's operator deploys it
    instead): ``items`` written under ``workdir``, the service started as its own process with no variable of
    this one (no credential: only ``PATH``), its base URL yielded once it answers, the process ended after."""
    path = workdir / "env-service-items.jsonl"
    path.write_text("".join(json.dumps(dict(item), sort_keys=True) + "\n" for item in items), "utf-8")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", __name__, "--host", "127.0.0.1", "--port", str(port), "--domain", domain]
    argv += ["--items", str(path), "--verifier", json.dumps(dict(verifier), sort_keys=True)]
    argv += [DOMAIN_OPTIONS_FLAG, json.dumps(dict(options or {}), sort_keys=True)]
    log_path = workdir / "env-service.log"
    with log_path.open("wb") as log_fh:
        proc = subprocess.Popen(
            argv,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", "")},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text("utf-8", "replace")[-1000:]
                    raise RuntimeError(f"the environment service did not start ({url}): {tail}") from None
                time.sleep(0.2)
        yield url
    finally:
        stop_process(proc)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m whale.tools.env_service", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--domain", required=True, help="the domain plugin (one whose steps the proposer may see)")
    p.add_argument("--items", type=Path, required=True, help="the D_harness items, JSON lines")
    p.add_argument("--verifier", default=None, help="spec.experiment.verifier as JSON (default: the paper's rules)")
    p.add_argument(
        DOMAIN_OPTIONS_FLAG, dest="domain_options", default=None, help="spec.experiment.domainOptions as JSON"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        replay = load_replay(args.domain, args.items, args.verifier, args.domain_options)
    except (OSError, ValueError, LookupError, ImportError) as exc:
        raise SystemExit(f"environment service: {exc}") from None
    log.info("serving %d %s tasks", len(replay.items), args.domain)
    import uvicorn

    uvicorn.run(create_app(replay), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
