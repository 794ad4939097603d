"""A small OpenAI-compatible server in front of any :class:`InferenceClient` (FastAPI + uvicorn).

Exposes the in-process transformers backend over HTTP, so the runtime's HTTP client, the local
runner and tests can use the same path production uses with vLLM. Endpoints: ``GET /v1/models``,
``POST /v1/chat/completions`` (non-streaming; ``n``, temperature/top_p/top_k, max_tokens or
max_completion_tokens, seed, stop, tools, and vLLM's ``chat_template_kwargs``, which reach the chat
template), ``GET /health``. Errors use the OpenAI error shape.

``python -m whale.inference.server --model NAME_OR_DIR [--gguf-file F] [--host H] [--port P]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from whale.inference.base import InferenceClient, InferenceError, SamplingParams


class ChatRequest(BaseModel):
    """The subset of the OpenAI chat-completions request this server honours (others ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(..., min_length=1)
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    stream: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


def create_app(client: InferenceClient, model_name: str | None = None, default_max_tokens: int = 1024) -> Any:
    """The FastAPI app serving ``client``."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    name = model_name or client.model
    app = FastAPI(title="whale inference", docs_url=None, redoc_url=None)

    def error(status: int, message: str, kind: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Any, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"invalid request: {exc.errors()}", "invalid_request_error")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "whale"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest) -> Any:
        if request.stream:
            return error(400, "streaming is not supported by this server", "invalid_request_error")
        stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
        try:
            sampling = SamplingParams(
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,
                max_tokens=request.max_completion_tokens or request.max_tokens or default_max_tokens,
                seed=request.seed,
                stop=stop,
                chat_template_kwargs=tuple(sorted((request.chat_template_kwargs or {}).items())),
            )
            result = await client.chat(request.messages, sampling, n=request.n, tools=request.tools)
        except ValueError as exc:
            return error(400, str(exc), "invalid_request_error")
        except InferenceError as exc:
            return error(500, str(exc), "server_error")
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": [
                {"index": i, "message": c.message, "finish_reason": c.finish_reason, "token_ids": c.token_ids}
                for i, c in enumerate(result.completions)
            ],
            "usage": {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        }

    return app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int | None = None, ready_timeout_s: float = 30.0
) -> Iterator[str]:
    """Run ``app`` with uvicorn on a background thread (its own event loop); yields the base URL
    (``http://host:port/v1``) once the server accepts connections; stops it on exit."""
    import uvicorn

    port = port or free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the inference server on {host}:{port} exited during start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the inference server on {host}:{port} did not start within {ready_timeout_s} s")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m whale.inference.server", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF id or local folder")
    parser.add_argument("--gguf-file", default=None)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    import uvicorn

    from whale.inference.transformers_backend import TransformersClient

    client = TransformersClient.from_pretrained(
        args.model, gguf_file=args.gguf_file, max_batch_size=args.max_batch_size, model_name=args.served_model_name
    )
    uvicorn.run(create_app(client), host=args.host, port=args.port, log_level="info")
    asyncio.run(client.aclose())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
