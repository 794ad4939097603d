"""Issue #29, item 4: every store call has a timeout. A tenant names the store's endpoint, and one that accepts a
connection and never answers (a black-holed proxy, a wedged server, a hostile endpoint) must cost a bounded time and
end in an error that names the store and the fix, never hold a reconcile (a worker thread of the operator) forever.

The endpoint is a loopback TCP listener that accepts and never answers; the client is the real minio SDK through the
project's one store client (its urllib3 pool's connect/read timeouts, its own retry deadline); the operator is the
real one (``kopf run``) against the API emulator."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.conftest import BASE_SPEC, deep_merge
from tests.operator.player import WR
from tests.operator.test_store_credentials import secret
from whale.control.storage import open_spec_store
from whale.core.spec import Storage
from whale.store.base import StoreUnavailable
from whale_operator.config import OperatorConfig, StoreBounds

pytestmark = pytest.mark.timeout(120)

#: seconds; small so the test is quick, the bound it checks is the same at any size
CONNECT_S, READ_S, DEADLINE_S = 1.0, 0.5, 1.5
#: a loaded machine may schedule the client late: headroom over the bound, far under "never"
SLACK_S = 10.0


@pytest.fixture()
def stalling_endpoint() -> Iterator[tuple[str, list[socket.socket]]]:
    """``host:port`` of a listener that accepts every connection and never sends a byte; and the accepted sockets."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(conn)  # held open, never read from nor written to

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        done.set()
        thread.join(timeout=10)
        listener.close()
        for conn in accepted:
            conn.close()


def test_a_store_that_never_answers_fails_in_bounded_time_naming_the_endpoint_and_the_fix(
    stalling_endpoint: tuple[str, list[socket.socket]],
):
    endpoint, accepted = stalling_endpoint
    storage = Storage.model_validate({"uri": "s3://bucket/p", "endpoint": endpoint, "secure": False})
    store = open_spec_store(
        storage,
        access_key="k",
        secret_key="s",
        env={},
        connect_timeout_s=CONNECT_S,
        read_timeout_s=READ_S,
        retry_deadline_s=DEADLINE_S,
    )
    with pytest.raises(StoreUnavailable) as unavailable:
        store.read_json("x.json")
    exc = unavailable.value
    assert accepted, "the client did connect: the stall is in the answer, not the connection"
    assert exc.attempts >= 2, "a timeout is transient: retried until the deadline"
    # a retry starts only if it ends before the deadline: the deadline plus one attempt's own timeouts at most
    assert exc.elapsed_s <= DEADLINE_S + CONNECT_S + READ_S + SLACK_S
    text = str(exc)
    assert f"http://{endpoint}" in text
    assert "Read timed out" in text and f"at most {CONNECT_S:g}s to connect and {READ_S:g}s for an answer" in text
    assert "Check that the server is running and answering" in text and "spec.execution.storage.endpoint" in text


def test_the_operators_store_bounds_come_from_its_own_environment():
    assert OperatorConfig.from_env({}).store_bounds == StoreBounds(5.0, 20.0, 20.0)
    env = {
        "WHALE_OPERATOR_STORE_CONNECT_TIMEOUT_S": "2",
        "WHALE_OPERATOR_STORE_READ_TIMEOUT_S": "3",
        "WHALE_OPERATOR_STORE_DEADLINE_S": "4",
    }
    assert OperatorConfig.from_env(env).store_bounds == StoreBounds(2.0, 3.0, 4.0)
    for bad in ("soon", "0", "-1", "inf", "nan"):  # inf: a call that never times out
        with pytest.raises(ValueError, match="WHALE_OPERATOR_STORE_DEADLINE_S"):
            StoreBounds.from_env({"WHALE_OPERATOR_STORE_DEADLINE_S": bad})


def test_a_run_whose_store_never_answers_says_so_in_status_and_the_operator_goes_on(
    start_operator,
    kube_cluster: EmulatedCluster,
    kube_namespace: str,
    stalling_endpoint: tuple[str, list[socket.socket]],
    monkeypatch: pytest.MonkeyPatch,
):
    endpoint, _ = stalling_endpoint
    monkeypatch.setenv("WHALE_OPERATOR_STORE_CONNECT_TIMEOUT_S", str(CONNECT_S))
    monkeypatch.setenv("WHALE_OPERATOR_STORE_READ_TIMEOUT_S", str(READ_S))
    monkeypatch.setenv("WHALE_OPERATOR_STORE_DEADLINE_S", str(DEADLINE_S))
    monkeypatch.setenv("WHALE_ALLOWED_S3_ENDPOINTS", endpoint)  # an allowed endpoint that went silent
    api = kube_cluster.api
    api.create(
        "v1", "secrets", kube_namespace, secret("keys", {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    )
    storage = {
        "uri": f"s3://bucket/stall-{uuid.uuid4().hex[:8]}",
        "endpoint": endpoint,
        "secure": False,
        "credentialsSecret": "keys",
    }
    body = {"apiVersion": WR, "kind": "WhaleRun", "metadata": {"name": "stall"}}
    body["spec"] = deep_merge(BASE_SPEC, {"storage": storage})
    with start_operator():
        api.create(WR, "whaleruns", kube_namespace, body)
        st = wait_for(
            lambda: (
                (s := api.get(WR, "whaleruns", kube_namespace, "stall").get("status") or {}).get("reason")
                == "StoreUnavailable"
                and s
            ),
            what="StoreUnavailable in status",
        )
        assert st["phase"] == "Pending"
        message = st["message"]
        assert message.startswith(f"spec.execution.storage.endpoint: the object store at {endpoint} did not answer")
        assert f"at most {CONNECT_S:g}s to connect and {READ_S:g}s for an answer" in message
        assert "check that the S3 server is up and reachable from the operator" in message
        events = wait_for(
            lambda: [
                e
                for e in api.list("v1", "events", kube_namespace)
                if e.get("reason") == "StoreUnavailable" and e.get("involvedObject", {}).get("name") == "stall"
            ],
            what="the Warning Event",
        )
        assert events[0]["type"] == "Warning"


def test_by_default_the_operator_calls_no_endpoint_a_tenant_names(
    start_operator,
    kube_cluster: EmulatedCluster,
    kube_namespace: str,
    stalling_endpoint: tuple[str, list[socket.socket]],
    monkeypatch: pytest.MonkeyPatch,
):
    """The endpoint allow-list is on by default: with no ``WHALE_ALLOWED_S3_ENDPOINTS`` a run naming an S3 endpoint is
    refused naming the field and the setting, and the operator never connects to it (an internal service here)."""
    endpoint, accepted = stalling_endpoint
    monkeypatch.delenv("WHALE_ALLOWED_S3_ENDPOINTS", raising=False)
    api = kube_cluster.api
    api.create(
        "v1", "secrets", kube_namespace, secret("keys", {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    )
    storage = {"uri": "s3://bucket/probe", "endpoint": endpoint, "secure": False, "credentialsSecret": "keys"}
    body = {"apiVersion": WR, "kind": "WhaleRun", "metadata": {"name": "probe"}}
    body["spec"] = deep_merge(BASE_SPEC, {"storage": storage})
    with start_operator():
        api.create(WR, "whaleruns", kube_namespace, body)
        st = wait_for(
            lambda: (
                (s := api.get(WR, "whaleruns", kube_namespace, "probe").get("status") or {}).get("reason")
                == "InvalidSpec"
                and s
            ),
            what="InvalidSpec in status",
        )
    assert st["message"].startswith(
        f"spec.execution.storage.endpoint: {endpoint} is not an S3 endpoint this operator may use"
    )
    assert "WHALE_ALLOWED_S3_ENDPOINTS" in st["message"] and "allowedS3Endpoints" in st["message"]
    assert accepted == [], "the operator connected to an endpoint nobody allowed"
