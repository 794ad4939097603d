"""The retriever as an HTTP service: ``POST /retrieve``, Search-R1's request/response shape, bounded.

    python -m whale.tools.retriever_service --corpus wiki_passages.jsonl [--method bm25|dense|e5 [--model DIR]]
    python -m whale.tools.retriever_service --index-dir DIR [--model DIR] [--device cuda]   # a prepared dense index

``--index-dir`` serves an index prepared by ``whale.tools.prepare_index`` (built here, or Search-R1's
``e5_Flat.index`` + ``wiki-18.jsonl`` adopted), encoding queries with the conventions its manifest records.
A cluster deploys one service per run and every harness process calls it
(``whale.tools.client.RetrieverClient``); Search-R1's own clients work against it unchanged.

Request: ``{"queries": [str, ...], "topk": int (default --topk), "return_scores": bool (default false)}``;
response: ``{"result": [[{"document": {"id", "title", "text", "contents"}, "score": float}, ...], ...]}``
with ``return_scores``, else ``{"result": [[{"id", "title", "text", "contents"}, ...], ...]}`` (documents
only), as Search-R1's ``retrieval_server.py`` answers. ``max_doc_tokens`` (optional, as the reference's server):
cut each passage's ``contents`` to that many tokens of the tokenizer the service was started with
(``--tokenizer DIR``, the policy's; :mod:`whale.tools.passage_cut`); a request's ``tokenizer_name`` is accepted and
ignored (the service never loads a tokenizer a request names). Bad requests (too many queries, a query too long,
topk out of range, a body too large, not JSON) get a 4xx with the field named; the service keeps serving.
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

from whale.tools import retrieval_index
from whale.tools.passage_cut import TokenCut

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Request bounds; the defaults cover Search-R1-style harnesses (a few queries, top-3) with room."""

    max_queries: int = 64
    max_query_chars: int = 1000
    max_topk: int = 50
    max_body_bytes: int = 256 * 1024
    #: topk of a request that names none (Search-R1's server: its --topk, 3)
    default_topk: int = 3
    #: the largest ``max_doc_tokens`` a request may ask for
    max_doc_tokens: int = 4096


class _Request(BaseModel):
    """The request's fields; :func:`_request_model` adds the configured limits."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False
    max_doc_tokens: int | None = None
    tokenizer_name: str | None = None


def _request_model(limits: Limits) -> type[_Request]:
    class RetrieveRequest(_Request):
        model_config = ConfigDict(extra="ignore")
        queries: list[str] = Field(..., min_length=1, max_length=limits.max_queries)
        topk: int | None = Field(None, ge=1, le=limits.max_topk)
        return_scores: bool = False
        max_doc_tokens: int | None = Field(None, ge=1, le=limits.max_doc_tokens)
        tokenizer_name: str | None = Field(None, max_length=200)

    return RetrieveRequest


def create_app(retriever: retrieval_index.Retriever, limits: Limits = Limits(), cut: TokenCut | None = None) -> FastAPI:
    """``cut``: the tokenizer that ``max_doc_tokens`` counts in; without it such a request is refused (422)."""
    app = FastAPI(title="whale retriever", docs_url=None, redoc_url=None)
    model = _request_model(limits)
    app.state.retriever = retriever

    def bad(status: int, detail: str) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=status)

    @app.get("/healthz")
    def healthz() -> dict:
        describe = getattr(retriever, "describe", None)
        about = describe() if describe else {"method": getattr(retriever, "method", "?")}
        return {"ok": True, **about, **({"tokenizer": cut.name} if cut else {})}

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
        if req.max_doc_tokens is not None and cut is None:
            return bad(
                422,
                "max_doc_tokens: this service has no tokenizer to count tokens with; start it with --tokenizer DIR "
                "(the policy's tokenizer folder) or leave max_doc_tokens out",
            )
        hits = await run_in_threadpool(retriever.search, req.queries, req.topk or limits.default_topk)
        if req.max_doc_tokens is not None and cut is not None:
            hits = await run_in_threadpool(cut.hits, hits, req.max_doc_tokens)
        if req.return_scores:
            return {"result": [[h.to_wire() for h in row] for row in hits]}
        return {"result": [[h.passage.to_dict() for h in row] for row in hits]}

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m whale.tools.retriever_service", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", type=Path, help="JSON-lines corpus (id, contents), indexed here by --method")
    src.add_argument("--index-dir", type=Path, help="a prepared dense index (python -m whale.tools.prepare_index)")
    p.add_argument("--method", choices=retrieval_index.METHODS, default="bm25", help="with --corpus")
    p.add_argument(
        "--model",
        default=None,
        help="encoder weights (local folder): e5 with --corpus; with --index-dir overrides the manifest's model",
    )
    p.add_argument("--device", default="cpu", help="where the dense encoder runs (cpu, cuda)")
    p.add_argument("--fp16", action="store_true", help="encode queries in half precision (GPU)")
    p.add_argument("--no-verify", action="store_true", help="skip the corpus checksum at start (size still checked)")
    p.add_argument("--cache-dir", type=Path, default=None, help="index cache (default $WHALE_CACHE_DIR/retriever)")
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="the policy's tokenizer folder: requests with max_doc_tokens are cut to that many of its tokens",
    )
    p.add_argument("--topk", type=int, default=Limits.default_topk, help="topk of a request that names none")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-queries", type=int, default=Limits.max_queries)
    p.add_argument("--max-query-chars", type=int, default=Limits.max_query_chars)
    p.add_argument("--max-topk", type=int, default=Limits.max_topk)
    p.add_argument(
        "--threads", type=int, default=1, help="torch/FAISS threads for dense retrieval (0 = library default)"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 1 <= args.topk <= args.max_topk:
        raise SystemExit(f"retriever: --topk {args.topk} must be from 1 to --max-topk ({args.max_topk})")
    dense = args.index_dir is not None or args.method != "bm25"
    if dense and args.threads > 0:
        retrieval_index.set_threads(args.threads)
    try:
        if args.index_dir is not None:
            retriever: retrieval_index.Retriever = retrieval_index.open_dense(
                args.index_dir, model=args.model, device=args.device, fp16=args.fp16, verify=not args.no_verify
            )
        else:
            retriever = retrieval_index.build(args.corpus, args.method, args.cache_dir, model=args.model)
        cut = TokenCut.load(args.tokenizer) if args.tokenizer is not None else None
    except retrieval_index.RetrieverError as exc:
        raise SystemExit(f"retriever: {exc}") from None
    import uvicorn

    limits = Limits(args.max_queries, args.max_query_chars, args.max_topk, default_topk=args.topk)
    uvicorn.run(create_app(retriever, limits, cut), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
