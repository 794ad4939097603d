"""The operator's own connections to the API server (``whale_operator.transport``) against real servers on loopback:
a stdlib HTTP server that plays a script per request (answer, close without answering, answer and close, hang), over
plain TCP and over TLS with certificates made by ``cryptography``. What is checked: the TLS the SDK's configuration
asks for (CA file or data, client certificate, ``insecure-skip-tls-verify``, ``tls-server-name``), a connection the
server closed is replaced before the next request, and a request other than a GET is never sent twice."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from tests.fixtures.http_double import DoubleHTTPServer
from tests.fixtures.tls import Authority, Pem
from whale_operator import transport
from whale_operator.kube import KubeClient
from whale_operator.transport import ConnectionLost


@dataclass
class Seen:
    conn: int
    method: str
    path: str
    body: bytes
    client: str | None


@dataclass
class Script:
    """What the server does: ``modes`` by request index (over all connections; default ``answer``)."""

    modes: dict[int, str] = field(default_factory=dict)
    #: close every connection after its answer without saying so (an idle timeout of zero)
    close_after_answer: bool = False
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    #: released once per connection the server has closed
    closed: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    release: threading.Event = field(default_factory=threading.Event)
    #: released once per request the server has read
    arrived: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    lock: threading.Lock = field(default_factory=threading.Lock)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        with self.server.script.lock:
            self.conn_id = self.server.script.connections
            self.server.script.connections += 1

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _client(self) -> str | None:
        peer: Any = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        names = {key: value for rdn in (peer or {}).get("subject", ()) for key, value in rdn}
        return str(names["commonName"]) if "commonName" in names else None

    def _serve(self) -> None:
        script = self.server.script
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with script.lock:
            index = len(script.seen)
            script.seen.append(Seen(self.conn_id, self.command, self.path, body, self._client()))
        script.arrived.release()
        mode = script.modes.get(index, "answer")
        if mode == "drop":  # read, then closed without a word
            self.close_connection = True
            return
        if mode == "hang":
            script.release.wait(30)
            self.close_connection = True
            return
        if mode == "hold":  # answered once released
            script.release.wait(30)
        data = json.dumps({"index": index, "conn": self.conn_id, "client": self._client()}).encode()
        if mode == "early_hints":  # an informational answer first, then the answer
            self.wfile.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
            self.wfile.flush()
        if mode in ("trailing", "garbage"):  # the answer and, unasked, more bytes in the same write
            extra = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}" if mode == "trailing" else b"\x00junk\r\n"
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            self.wfile.write(head.encode() + data + extra)
            return  # the connection kept open: whether it is used again is the client's choice
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if mode == "unframed":  # no length: the body ends where the connection does
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
            return
        self.send_header("Content-Length", str(len(data) + (100 if mode == "truncated" else 0)))
        self.end_headers()
        self.wfile.write(data)
        if script.close_after_answer or mode == "truncated":
            self.close_connection = True

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve  # noqa: N815  # http.server's names


class Server(DoubleHTTPServer):
    """Quiet when a client hangs up, as several scripts here do (:class:`DoubleHTTPServer`)."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None):
        self.script, self.tls = script, tls
        super().__init__(("127.0.0.1", 0), Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        if self.tls is None:
            return sock, addr
        sock.settimeout(10)
        try:
            return self.tls.wrap_socket(sock, server_side=True), addr
        except OSError:
            sock.close()
            raise

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.script.closed.release()

    @property
    def url(self) -> str:
        port = self.server_address[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(script, tls=None)`` starts a server in a thread; stopped at teardown."""
    servers: list[Server] = []

    def start(script: Script, tls: ssl.SSLContext | None = None) -> Server:
        server = Server(script, tls)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.script.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def clients() -> Iterator[list[KubeClient]]:
    made: list[KubeClient] = []
    yield made
    for kube in made:
        kube.close()


def kubeconfig(path: Path, url: str, **cluster: Any) -> Path:
    user = cluster.pop("user", {"token": "t0ken"})
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": url, **cluster}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return path


def client_for(
    path: Path, url: str, clients: list[KubeClient], monkeypatch: pytest.MonkeyPatch, **cluster: Any
) -> KubeClient:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(path, url, **cluster)))
    kube = KubeClient.from_environment()
    clients.append(kube)
    return kube


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wait_closed(script: Script, n: int = 1) -> None:
    for _ in range(n):
        assert script.closed.acquire(timeout=10), "the server did not close the connection"


# --- plain HTTP ---
def test_a_connection_the_server_closed_is_replaced_before_the_next_request(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(close_after_answer=True)
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    assert kube.request("GET", "/api/v1/namespaces")["conn"] == 0
    wait_closed(script)  # closed by the server while idle: seen before the next request, not under it
    answer = kube.request("PATCH", "/api/v1/namespaces/a", body={"x": 1})
    assert answer["conn"] == 1 and answer["index"] == 1
    assert [(s.method, s.conn) for s in script.seen] == [("GET", 0), ("PATCH", 1)]
    assert script.seen[1].body == b'{"x": 1}'


def test_a_kept_connection_carries_the_next_requests(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url + "/through/a/path", clients, monkeypatch)
    for i in range(5):
        kube.request("POST", "/api/v1/namespaces/a/configmaps", body={"i": i}, query={"labelSelector": "a=b"})
    assert script.connections == 1 and {s.conn for s in script.seen} == {0}
    # the server URL's own path before each request's, the query encoded, the body whole
    assert script.seen[0].path == "/through/a/path/api/v1/namespaces/a/configmaps?labelSelector=a%3Db"
    assert [json.loads(s.body)["i"] for s in script.seen] == [0, 1, 2, 3, 4]


def test_a_get_lost_on_a_kept_connection_is_sent_once_more_on_a_new_one(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(modes={1: "drop"})
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    kube.request("GET", "/api/v1/namespaces")
    answer = kube.request("GET", "/api/v1/namespaces")  # the kept connection closed under it: a GET changes nothing
    assert answer == {"index": 2, "conn": 1, "client": None}
    assert [(s.method, s.conn) for s in script.seen] == [("GET", 0), ("GET", 0), ("GET", 1)]


@pytest.mark.parametrize("method", ["POST", "PATCH", "DELETE", "PUT"])
def test_a_write_lost_on_a_kept_connection_is_never_sent_twice(
    method: str, serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(modes={1: "drop"})
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    kube.request("GET", "/api/v1/namespaces")
    with pytest.raises(ConnectionLost, match="closed the connection before its whole answer"):
        kube.request(method, "/api/v1/namespaces/a/configmaps/c", body={"w": 1})
    # the server got it once and the client did not send it again: it may have been applied
    assert [s.method for s in script.seen] == ["GET", method]
    assert kube.request("GET", "/api/v1/namespaces")["conn"] == 1  # the next request: a new connection


def test_an_answer_cut_short_is_an_error_and_one_ended_by_close_is_whole(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(modes={0: "unframed", 1: "truncated"})
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    assert kube.request("GET", "/api/v1/namespaces")["index"] == 0  # no length: up to the close
    with pytest.raises(ConnectionLost, match="before its whole answer"):
        kube.request("POST", "/api/v1/namespaces", body={})
    assert kube.request("GET", "/api/v1/namespaces")["index"] == 2


def test_an_informational_answer_before_the_answer_is_passed_over(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(modes={0: "early_hints"})
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    assert kube.request("PATCH", "/api/v1/namespaces/a", body={}) == {"index": 0, "conn": 0, "client": None}
    assert kube.request("GET", "/api/v1/namespaces")["conn"] == 0  # and the connection stays in step


@pytest.mark.parametrize("mode", ["trailing", "garbage"])
def test_bytes_after_an_answer_spoil_the_connection_not_the_answer(
    mode: str, serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(modes={0: mode})
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    assert kube.request("POST", "/api/v1/namespaces", body={})["index"] == 0
    # never the unasked bytes as the next answer: the next request goes on a new connection
    assert kube.request("POST", "/api/v1/namespaces", body={}) == {"index": 1, "conn": 1, "client": None}


def test_a_silent_server_is_given_up_at_the_deadline(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(modes={0: "hang"})
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    assert kube._transport is not None
    kube._transport.timeout_s = 0.3
    with pytest.raises(ConnectionLost, match="in time"):
        kube.request("PATCH", "/api/v1/namespaces/a", body={})
    assert len(script.seen) == 1


def test_close_leaves_a_request_in_flight_to_end_then_closes_its_connection(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(modes={1: "hold"})
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    kube.request("GET", "/api/v1/namespaces")  # this thread's connection, idle from now on
    answers: list[dict[str, Any]] = []
    other = threading.Thread(target=lambda: answers.append(kube.request("PATCH", "/api/v1/namespaces/a", body={})))
    other.start()
    for _ in range(2):
        assert script.arrived.acquire(timeout=10), "the requests did not arrive"
    kube.close()  # the idle connection now; the other thread's socket is never closed under its read
    wait_closed(script)
    script.release.set()
    other.join(timeout=10)
    assert answers == [{"index": 1, "conn": 1, "client": None}]
    wait_closed(script)  # and its connection once its answer came
    assert kube.request("GET", "/api/v1/namespaces")["conn"] == 2  # after the close: a new connection, not kept


def test_an_idle_connection_is_not_reused_past_its_idle_time(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch)
    kube.request("GET", "/api/v1/namespaces")
    monkeypatch.setattr(transport, "IDLE_S", 0.0)  # every kept connection is now too old to trust
    kube.request("POST", "/api/v1/namespaces", body={})
    assert [s.conn for s in script.seen] == [0, 1]
    wait_closed(script)  # the old one was closed by the client, not left open


def test_a_line_break_in_a_header_is_refused_before_anything_is_sent(
    serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script)
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch, user={"token": "a\r\nX-Evil: 1"})
    with pytest.raises(ValueError, match="line break"):
        kube.request("GET", "/api/v1/namespaces")
    assert script.seen == [] and script.connections == 0


def test_through_an_http_proxy_the_requests_stay_with_urllib3() -> None:
    cfg = k8s_client.Configuration(host="https://api.example:6443")
    cfg.proxy = "http://proxy.example:3128"
    kube = KubeClient(k8s_client.ApiClient(cfg))
    try:
        assert kube._transport is None  # urllib3's ProxyManager writes the request for the proxy
    finally:
        kube.close()


# --- TLS ---
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Authority(folder, "whale-test-ca"), Authority(folder, "another-ca")
    return {
        "ca": ca,
        "other": other,
        "server": ca.issue("server", ips=("127.0.0.1",), dns=("localhost",)),
        "named": ca.issue("named", dns=("api.internal",)),  # not valid for 127.0.0.1
        "client": ca.issue("operator-client", client=True),
    }


def tls_server(pem: Pem, ca: Authority, *, require_client: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pem.cert, pem.key)
    ctx.load_verify_locations(cafile=str(ca.path))
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client else ssl.CERT_OPTIONAL
    return ctx


def test_tls_with_the_right_ca_and_a_client_certificate(
    pki: dict[str, Any], serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script, tls_server(pki["server"], pki["ca"], require_client=True))
    client: Pem = pki["client"]
    kube = client_for(
        tmp_path / "kc",
        server.url,
        clients,
        monkeypatch,
        **{"certificate-authority-data": b64(pki["ca"].pem)},
        user={
            "client-certificate-data": b64(client.cert.read_bytes()),
            "client-key-data": b64(client.key.read_bytes()),
        },
    )
    assert kube.request("GET", "/api/v1/namespaces")["client"] == "operator-client"  # presented and accepted
    assert kube.request("POST", "/api/v1/namespaces", body={})["conn"] == 0  # the TLS connection is kept


def test_tls_without_the_client_certificate_the_server_asks_for_fails(
    pki: dict[str, Any], serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script, tls_server(pki["server"], pki["ca"], require_client=True))
    kube = client_for(
        tmp_path / "kc", server.url, clients, monkeypatch, **{"certificate-authority-data": b64(pki["ca"].pem)}
    )
    with pytest.raises(ConnectionLost):
        kube.request("GET", "/api/v1/namespaces")
    assert script.seen == []


def test_tls_with_a_wrong_ca_is_refused(
    pki: dict[str, Any], serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script, tls_server(pki["server"], pki["ca"]))
    kube = client_for(
        tmp_path / "kc", server.url, clients, monkeypatch, **{"certificate-authority": str(pki["other"].path)}
    )
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
        kube.request("GET", "/api/v1/namespaces")
    assert script.seen == []  # nothing was sent over it


def test_tls_insecure_skip_verify_skips_verification(
    pki: dict[str, Any], serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script, tls_server(pki["named"], pki["ca"]))  # neither its CA nor its name would pass
    kube = client_for(tmp_path / "kc", server.url, clients, monkeypatch, **{"insecure-skip-tls-verify": True})
    assert kube.request("GET", "/api/v1/namespaces")["index"] == 0


def test_tls_server_name_is_the_name_checked(
    pki: dict[str, Any], serve: Any, clients: list[KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    server = serve(script, tls_server(pki["named"], pki["ca"]))  # valid for api.internal, reached by IP
    ca = {"certificate-authority-data": b64(pki["ca"].pem)}
    plain = client_for(tmp_path / "kc1", server.url, clients, monkeypatch, **ca)
    with pytest.raises(ConnectionLost, match="IP address mismatch|doesn't match|CERTIFICATE_VERIFY_FAILED"):
        plain.request("GET", "/api/v1/namespaces")
    named = client_for(tmp_path / "kc2", server.url, clients, monkeypatch, **ca, **{"tls-server-name": "api.internal"})
    assert named.request("GET", "/api/v1/namespaces")["index"] == 0


def test_tls_with_ca_data_in_the_configuration(pki: dict[str, Any], serve: Any, clients: list[KubeClient]) -> None:
    script = Script()
    server = serve(script, tls_server(pki["server"], pki["ca"]))
    for ca, works in ((pki["ca"], True), (pki["other"], False)):
        cfg = k8s_client.Configuration(host=server.url)
        cfg.ca_cert_data = ca.pem.decode()
        kube = KubeClient(k8s_client.ApiClient(cfg))
        clients.append(kube)
        if works:
            assert kube.request("GET", "/api/v1/namespaces")["index"] == 0
        else:
            with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
                kube.request("GET", "/api/v1/namespaces")
