"""The retriever as an HTTP service: ``POST /retrieve`` (Search-R1's request/response shape), bounded.

Run ``python -m whale.tools.retriever --corpus wiki_passages.jsonl [--method bm25|dense]``; a cluster
deploys one and every harness process calls it (``whale.tools.client.RetrieverClient``).

Request: ``{"queries": [str, ...], "topk": int, "return_scores": bool}``;
response: ``{"result": [[{"document": {"id", "title", "text", "contents"}, "score": float}, ...], ...]}``.
Bad requests (too many queries, a query too long, topk out of range, a body too large, not JSON)
get a 4xx with the field named; the service keeps serving.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from whale.tools import retrieval

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Request bounds; the defaults cover Search-R1-style harnesses (a few queries, top-3) with room."""

    max_queries: int = 64
    max_query_chars: int = 1000
    max_topk: int = 50
    max_body_bytes: int = 256 * 1024


def _request_model(limits: Limits) -> type[BaseModel]:
    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")
        queries: list[str] = Field(..., min_length=1, max_length=limits.max_queries)
        topk: int = Field(3, ge=1, le=limits.max_topk)
        return_scores: bool = True

    return RetrieveRequest


def create_app(retriever: retrieval.Retriever, limits: Limits = Limits()) -> FastAPI:
    app = FastAPI(title="whale retriever", docs_url=None, redoc_url=None)
    model = _request_model(limits)
    app.state.retriever = retriever

    def bad(status: int, detail: str) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=status)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True, "method": getattr(retriever, "method", "?"),
                "passages": len(getattr(retriever, "passages", ()))}

    @app.post("/retrieve")
    async def retrieve(request: Request):
        body = await request.body()
        if len(body) > limits.max_body_bytes:
            return bad(413, f"request body is {len(body)} bytes; the limit is {limits.max_body_bytes}")
        try:
            req = model.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            return bad(422, f"{where}: {first.get('msg')}")
        for i, q in enumerate(req.queries):
            if len(q) > limits.max_query_chars:
                return bad(422, f"queries.{i}: {len(q)} characters; the limit is {limits.max_query_chars}")
        hits = await run_in_threadpool(retriever.search, req.queries, req.topk)
        result = []
        for row in hits:
            items = [h.to_wire() for h in row]
            if not req.return_scores:
                items = [{"document": it["document"]} for it in items]
            result.append(items)
        return {"result": result}

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m whale.tools.retriever", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="JSON-lines corpus (id, contents)")
    p.add_argument("--method", choices=retrieval.METHODS, default="bm25")
    p.add_argument("--cache-dir", type=Path, default=None, help="index cache (default $WHALE_CACHE_DIR/retriever)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-queries", type=int, default=Limits.max_queries)
    p.add_argument("--max-query-chars", type=int, default=Limits.max_query_chars)
    p.add_argument("--max-topk", type=int, default=Limits.max_topk)
    p.add_argument("--threads", type=int, default=1, help="torch/FAISS threads for dense retrieval (0 = library default)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.method == "dense" and args.threads > 0:
        retrieval.set_threads(args.threads)
    try:
        retriever = retrieval.build(args.corpus, args.method, args.cache_dir)
    except retrieval.RetrieverError as exc:
        raise SystemExit(f"retriever: {exc}") from None
    import uvicorn

    limits = Limits(args.max_queries, args.max_query_chars, args.max_topk)
    uvicorn.run(create_app(retriever, limits), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
