"""The code interpreter as an HTTP service: ``POST /run`` executes one snippet in a fresh sandbox.

Run ``python -m whale.tools.code_interpreter [--host H] [--port P] [--concurrency N]``; a cluster deploys
one (as root inside its container, so each run gets its own uid and namespaces) and harness processes
call it through ``whale.tools.client.CodeClient``.

Request ``{"code": str, "timeout_s": float?}``; response ``{"outcome", "output", "error", "wall_s"}``
(``error`` is the tool error shown to the model: a timeout, a memory bomb, an exception's traceback).
Hostile code is the normal case, so every such run is a 200 with an ``error``; only malformed requests
(not JSON, code too long, a timeout out of range) get a 4xx, and a full queue a 503.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from whale.sandbox import Isolation
from whale.tools.code import CodeLimits, execute

log = logging.getLogger(__name__)


def create_app(
    limits: CodeLimits = CodeLimits(),
    concurrency: int | None = None,
    max_waiting: int = 256,
    isolation: Isolation | None = None,
) -> FastAPI:
    """``isolation``: each run's sandbox (None: the code tool's default, kernel namespaces)."""
    concurrency = concurrency or max(1, os.cpu_count() or 1)

    class RunRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        code: str = Field(..., max_length=limits.max_code_chars)
        timeout_s: float | None = Field(None, gt=0, le=limits.timeout_s)

    app = FastAPI(title="whale code interpreter", docs_url=None, redoc_url=None)
    slots = asyncio.Semaphore(concurrency)
    counters = {"waiting": 0, "runs": 0, "errors": 0}
    max_body = limits.max_code_chars * 4 + 1024

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True, "concurrency": concurrency, **counters}

    @app.post("/run")
    async def run(request: Request):
        body = await request.body()
        if len(body) > max_body:
            return JSONResponse({"detail": f"request body is {len(body)} bytes; the limit is {max_body}"}, 413)
        try:
            req = RunRequest.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            return JSONResponse({"detail": f"{where}: {first.get('msg')}"}, 422)
        if counters["waiting"] >= max_waiting:
            return JSONResponse({"detail": "too many queued runs; retry later"}, 503)
        counters["waiting"] += 1
        try:
            await slots.acquire()
        finally:
            counters["waiting"] -= 1
        try:
            result = await run_in_threadpool(execute, req.code, limits, req.timeout_s, isolation)
        finally:
            slots.release()
        counters["runs"] += 1
        counters["errors"] += int(not result.ok)
        return result.to_dict()

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m whale.tools.code_interpreter", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--concurrency", type=int, default=None, help="sandboxes running at once (default: CPU count)")
    p.add_argument("--timeout-s", type=float, default=CodeLimits.timeout_s, help="max wall time per run")
    p.add_argument("--memory-mb", type=int, default=CodeLimits.memory_mb)
    p.add_argument(
        "--isolation",
        choices=("namespaces", "pod"),
        default="namespaces",
        help="spec.execution.sandbox.isolation: pod = this pod is the wall (no credentials, no token, no egress), each run "
        "keeps its rlimits, scratch directory and allow-listed environment but no kernel namespaces",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    isolation = None
    if args.isolation == "pod":  # the pod is the wall: refuse to serve where a credential is in reach
        from whale.harness.host import credential_exposure

        exposed = credential_exposure(os.environ)
        if exposed:
            raise SystemExit("code interpreter refuses to serve at isolation pod: it can see " + "; ".join(exposed))
        isolation = Isolation.none()
    limits = CodeLimits(timeout_s=args.timeout_s, memory_mb=args.memory_mb)
    app = create_app(limits, args.concurrency, isolation=isolation)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
