"""A tenant names its store's endpoint, so what that endpoint answers must not reach the run's status (issue #29: an
S3 error body holding "db-password=hunter2" landed in tenant-readable status). The endpoint here is a hostile
stand-in (a loopback HTTP server answering every request like S3 refusing the keys, its message chosen by the
attacker); the client is the real minio SDK through the project's store, the operator the real one against the API
emulator. Status shows the classified refusal (the S3 error code), never the body."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from tests.fixtures.http_double import DoubleHTTPServer
from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.conftest import BASE_SPEC, deep_merge
from tests.operator.player import WR
from tests.operator.test_store_credentials import secret
from whale.control.storage import open_spec_store
from whale.core.spec import Storage
from whale.store.base import StoreAuthError

pytestmark = pytest.mark.timeout(120)

SECRET_IN_BODY = "db-password=hunter2"
BODY = (
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    f"<Message>{SECRET_IN_BODY}</Message><Resource>/b</Resource><RequestId>1</RequestId></Error>"
).encode()


class _Hostile(BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(BODY)

    def do_GET(self) -> None:
        self._refuse()

    def do_HEAD(self) -> None:
        self._refuse()

    def do_PUT(self) -> None:
        self._refuse()

    def do_POST(self) -> None:
        self._refuse()

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture()
def hostile_endpoint() -> Iterator[str]:
    server = DoubleHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_store_keeps_the_code_apart_from_the_endpoints_text(hostile_endpoint: str):
    storage = Storage.model_validate({"uri": "s3://bucket/p", "endpoint": hostile_endpoint, "secure": False})
    store = open_spec_store(storage, access_key="k", secret_key="s", env={})
    with pytest.raises(StoreAuthError) as refused:
        store.read_json("x.json")
    assert SECRET_IN_BODY in str(refused.value), "the endpoint's text did arrive (the attack is real)"
    assert refused.value.code == "AccessDenied"


def test_a_hostile_endpoints_answer_never_reaches_the_runs_status(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, hostile_endpoint: str, monkeypatch
):
    # an endpoint the admin allowed that turned hostile (or was hijacked): the allow-list is not the only wall
    monkeypatch.setenv("WHALE_ALLOWED_S3_ENDPOINTS", hostile_endpoint)
    api = kube_cluster.api
    api.create(
        "v1", "secrets", kube_namespace, secret("keys", {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    )
    storage = {
        "uri": f"s3://bucket/hostile-{uuid.uuid4().hex[:8]}",
        "endpoint": hostile_endpoint,
        "secure": False,
        "credentialsSecret": "keys",
    }
    body = {"apiVersion": WR, "kind": "WhaleRun", "metadata": {"name": "hostile"}}
    body["spec"] = deep_merge(BASE_SPEC, {"storage": storage})
    with start_operator():
        api.create(WR, "whaleruns", kube_namespace, body)
        st = wait_for(
            lambda: (
                (s := api.get(WR, "whaleruns", kube_namespace, "hostile").get("status") or {}).get("reason")
                == "WaitingForCredentials"
                and s
            ),
            what="the refusal in status",
        )
        assert "the store refused Secret keys's keys (AccessDenied)" in st["message"]
        assert SECRET_IN_BODY not in str(st)
