"""The storage client against a real S3 server (SeaweedFS on loopback) and the local directory.

One behavioural suite runs on both backends (the ``store`` fixture), so "same behaviour as the
local store" is checked, not assumed. Then what only S3 has: credentials, bucket creation, a
server that goes away, and the pure configuration/retry pieces of ``whale.store.s3``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError

from tests.fixtures.s3 import S3ServerInfo, SeaweedServer
from whale.store import ObjectNotFound, Store, StoreAuthError, StoreError, StoreUnavailable
from whale.store.base import StoreFull, StoreReadOnly, StoreWriteDenied
from whale.store.lease import LeaseHeld, LeaseLost, machine_id, this_process
from whale.store.local import LocalStore
from whale.store.s3 import (
    ENV_ACCESS_KEY,
    ENV_ENDPOINT,
    ENV_SECRET_KEY,
    ErrorKind,
    RetryPolicy,
    S3Store,
    call_with_retry,
    classify,
    parse_s3_uri,
    resolve_config,
)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")


# ----- one behaviour, two backends -------------------------------------------------------------------


def test_round_trip(store: Store) -> None:
    store.write_bytes("runs/r/a.bin", b"\x00\x01binary")
    store.write_text("runs/r/t.txt", "héllo")
    store.write_json("runs/r/s.json", {"phase": "Running", "cycle": 2})
    assert store.read_bytes("runs/r/a.bin") == b"\x00\x01binary"
    assert store.read_text("runs/r/t.txt") == "héllo"
    assert store.read_json("runs/r/s.json") == {"phase": "Running", "cycle": 2}
    assert store.read_json_or_none("runs/r/s.json") == {"phase": "Running", "cycle": 2}
    assert store.exists("runs/r/a.bin")
    assert store.uri_for("runs/r/a.bin") == store.uri + "/runs/r/a.bin"
    store.write_bytes("runs/r/empty", b"")
    assert store.read_bytes("runs/r/empty") == b""


def test_overwrite_replaces(store: Store) -> None:
    store.write_bytes("k", b"a much longer first version")
    store.write_bytes("k", b"short")
    assert store.read_bytes("k") == b"short"


def test_equivalent_keys_name_one_object(store: Store) -> None:
    store.write_bytes("/a//b/./c/", b"1")
    assert store.read_bytes("a/b/c") == b"1"
    assert store.read_bytes("a/x/../b/c") == b"1"
    assert store.list("") == ["a/b/c"]


def test_missing_keys(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match="'runs/r/nope.json'") as info:
        store.read_bytes("runs/r/nope.json")
    assert info.value.key == "runs/r/nope.json"
    assert isinstance(info.value, KeyError)
    assert store.read_json_or_none("runs/r/nope.json") is None
    assert store.read_jsonl("runs/r/metrics.jsonl") == []
    assert not store.exists("runs/r/nope.json")
    store.delete("runs/r/nope.json")  # missing is fine
    store.delete_prefix("runs/nothing-here")
    with pytest.raises(ObjectNotFound):
        store.download_dir("runs/r/nothing", tmp_path / "dl")
    with pytest.raises(ObjectNotFound):
        store.download_file("runs/r/nope.json", tmp_path / "dl" / "f")


def test_a_folder_is_not_an_object(store: Store) -> None:
    store.write_bytes("d/e/f", b"1")
    assert not store.exists("d")
    assert not store.exists("d/e")
    with pytest.raises(ObjectNotFound):
        store.read_bytes("d/e")
    store.delete("d")  # deletes nothing
    assert store.read_bytes("d/e/f") == b"1"


@pytest.mark.parametrize("key", ["../outside", "a/../../outside", ""])
def test_keys_cannot_escape_the_root(store: Store, key: str) -> None:
    with pytest.raises(StoreError, match="escapes the store root|names the store root"):
        store.write_bytes(key, b"x")
    with pytest.raises(StoreError, match="escapes the store root|names the store root"):
        store.read_bytes(key)


def test_append_jsonl(store: Store) -> None:
    key = "runs/r/phases/c00-weight/metrics.jsonl"
    store.append_jsonl(key, {"step": 1, "rewardMean": 0.25})
    store.append_jsonl(key, [{"step": 2, "rewardMean": 0.5}, {"step": 3, "rewardMean": 0.75}])
    store.append_jsonl(key, [])
    assert store.read_jsonl(key) == [
        {"step": 1, "rewardMean": 0.25},
        {"step": 2, "rewardMean": 0.5},
        {"step": 3, "rewardMean": 0.75},
    ]
    assert store.read_text(key).count("\n") == 3


def test_append_jsonl_after_a_file_without_final_newline(store: Store) -> None:
    store.write_bytes("m.jsonl", b'{"a": 1}')
    store.append_jsonl("m.jsonl", {"a": 2})
    assert store.read_jsonl("m.jsonl") == [{"a": 1}, {"a": 2}]


def test_list(store: Store) -> None:
    for key in [
        "runs/a/spec.json",
        "runs/a/phases/c00-weight/result.json",
        "runs/a/phases/c01-weight/STOP",
        "runs/ab/spec.json",
        "data/x/train.jsonl",
    ]:
        store.write_bytes(key, b"{}")
    assert store.list("runs/a") == [
        "runs/a/phases/c00-weight/result.json",
        "runs/a/phases/c01-weight/STOP",
        "runs/a/spec.json",
    ]
    assert store.list("runs/a/") == store.list("runs/a")  # trailing '/' optional; never matches runs/ab
    assert store.list("runs/a", recursive=False) == ["runs/a/phases/", "runs/a/spec.json"]
    assert store.list("runs", recursive=False) == ["runs/a/", "runs/ab/"]
    assert store.list("", recursive=False) == ["data/", "runs/"]
    assert len(store.list("")) == 5
    assert store.list("runs/a/spec.json") == []  # an object is not a folder
    assert store.list("nothing") == [] and store.list("nothing", recursive=False) == []


def test_deleted_folders_vanish_from_listings(store: Store) -> None:
    store.write_bytes("runs/a/phases/c00-weight/STOP", b"")
    store.write_bytes("runs/a/spec.json", b"{}")
    store.delete("runs/a/phases/c00-weight/STOP")
    assert store.list("runs/a", recursive=False) == ["runs/a/spec.json"]


def test_usage_sums_the_objects_under_a_folder(store: Store) -> None:
    store.write_bytes("runs/a/x.bin", b"12345")
    store.write_bytes("runs/a/deep/y.bin", b"123")
    store.write_bytes("runs/ab/z.bin", b"1234567")  # a sibling whose name starts the same: not counted
    assert store.usage("runs/a") == store.usage("runs/a/") == 8
    assert store.usage("runs") == 15 and store.usage("runs/none") == 0


def test_delete_prefix(store: Store) -> None:
    for i in range(5):
        store.write_bytes(f"runs/a/checkpoints/step-00000{i}/model.safetensors", b"w")
    store.write_bytes("runs/a/spec.json", b"{}")
    store.write_bytes("runs/ab/spec.json", b"{}")
    store.delete_prefix("runs/a/checkpoints")
    assert store.list("runs") == ["runs/a/spec.json", "runs/ab/spec.json"]


def test_upload_dir_writes_the_marker_last(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    (src / "model.safetensors").write_bytes(b"\x00" * 1000)
    (src / "sub" / "tokenizer.json").write_text("{}")
    (src / "COMPLETE").write_text("stale marker in the source folder")
    prefix = "runs/r/checkpoints/step-000044"
    store.write_bytes(f"{prefix}/COMPLETE", b"")  # a previous, complete upload to the same place

    calls: list[tuple[str, str]] = []
    spy_store_calls(store, calls)
    store.upload_dir(src, prefix, marker="COMPLETE")

    assert calls[0] == ("delete", f"{prefix}/COMPLETE"), "a stale marker must go before any file changes"
    assert calls[-1] == ("write", f"{prefix}/COMPLETE"), "the marker must be the last write"
    assert sorted(k for op, k in calls[1:-1]) == [
        f"{prefix}/config.json",
        f"{prefix}/model.safetensors",
        f"{prefix}/sub/tokenizer.json",
    ]
    assert store.read_bytes(f"{prefix}/COMPLETE") == b""
    assert store.read_bytes(f"{prefix}/model.safetensors") == b"\x00" * 1000


def spy_store_calls(store: Store, calls: list[tuple[str, str]]) -> None:
    """Record the object writes/deletes a store makes (instance-level wrappers around its own methods)."""
    for name, op in (("write_bytes", "write"), ("upload_file", "write"), ("delete", "delete")):
        real = getattr(store, name)

        def wrapper(*args: object, _real: Callable[..., object] = real, _op: str = op, _name: str = name) -> object:
            key = args[1] if _name == "upload_file" else args[0]
            calls.append((_op, str(key)))
            return _real(*args)

        setattr(store, name, wrapper)


def test_download_dir(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "x.json").write_text("{}")
    (src / "a" / "b" / "y.bin").write_bytes(bytes(range(256)) * 100)
    store.upload_dir(src, "runs/r/archive/c01", marker="DONE")
    out = store.download_dir("runs/r/archive/c01", tmp_path / "out", marker="DONE")
    assert out == tmp_path / "out"
    assert (out / "x.json").read_text() == "{}"
    assert (out / "a" / "b" / "y.bin").read_bytes() == bytes(range(256)) * 100
    assert (out / "DONE").exists()


def test_download_dir_refuses_an_incomplete_folder(store: Store, tmp_path: Path) -> None:
    store.write_bytes("runs/r/checkpoints/step-000001/config.json", b"{}")
    with pytest.raises(ObjectNotFound, match="step-000001/COMPLETE"):
        store.download_dir("runs/r/checkpoints/step-000001", tmp_path / "out", marker="COMPLETE")
    assert not (tmp_path / "out").exists()


def test_upload_and_download_file(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(b"0123456789abcdef" * 65536)  # 1 MiB
    store.upload_file(src, "f/big.bin")
    dest = store.download_file("f/big.bin", tmp_path / "dl" / "big.bin")
    assert dest.read_bytes() == src.read_bytes()


def test_atomic_replace_under_a_concurrent_reader(store: Store) -> None:
    """A reader polling while a writer rewrites a large object sees one whole version, never a mix."""
    size = 4 * 1024 * 1024
    store.write_bytes("big", bytes([0]) * size)
    done = threading.Event()
    seen: list[tuple[int, int, bool]] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not done.is_set():
                data = store.read_bytes("big")
                seen.append((len(data), data[0], data.count(data[:1]) == len(data)))
        except BaseException as exc:  # noqa: BLE001 - a thread's failure, asserted on by the test
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for version in range(1, 9):
            store.write_bytes("big", bytes([version]) * size)
    finally:
        done.set()
        thread.join(timeout=60)
    assert not errors, errors
    assert seen, "the reader never completed a read"
    torn = [s for s in seen if s[0] != size or not s[2]]
    assert not torn, f"{len(torn)} of {len(seen)} reads saw a partial or mixed object: {torn[:3]}"
    assert store.read_bytes("big") == bytes([8]) * size


# ----- S3 only: credentials, buckets, outages -----------------------------------------------------------


def test_wrong_secret_is_an_auth_error_without_retries(s3_server: S3ServerInfo) -> None:
    sleeps: list[float] = []
    bad = s3_server.store("s3://whale-test/auth", secret_key="not-the-secret", sleep=sleeps.append)
    for op in (
        lambda: bad.read_bytes("x"),
        lambda: bad.write_bytes("x", b"1"),
        lambda: bad.exists("x"),
        lambda: bad.list(""),
        bad.check,
    ):
        with pytest.raises(StoreAuthError) as info:
            op()
        message = str(info.value)
        assert ENV_ACCESS_KEY in message and ENV_SECRET_KEY in message
        assert "spec.execution.storage.credentialsSecret" in message
        assert s3_server.endpoint in message
        assert "not-the-secret" not in message
    assert sleeps == [], "rejected credentials must not be retried"


def test_unknown_access_key_is_an_auth_error(s3_server: S3ServerInfo) -> None:
    bad = s3_server.store("s3://whale-test/auth", access_key="nobody")
    with pytest.raises(StoreAuthError, match="'nobody'"):
        bad.read_bytes("x")


def test_missing_credentials_name_the_variables(s3_server: S3ServerInfo) -> None:
    with pytest.raises(StoreAuthError, match=f"{ENV_SECRET_KEY} not set"):
        S3Store("b-x", endpoint=s3_server.url, access_key="a", env={})
    with pytest.raises(StoreError, match=ENV_ENDPOINT):
        S3Store("b-x", access_key="a", secret_key="b", env={})


def test_configuration_from_the_environment(s3_server: S3ServerInfo) -> None:
    env = s3_server.env()
    store = S3Store.from_uri("s3://whale-test/env-config", env=env)
    store.write_bytes("k", b"v")
    assert s3_server.store("s3://whale-test/env-config").read_bytes("k") == b"v"


def test_a_subprocess_reaches_the_server_from_the_environment(s3_server: S3ServerInfo, s3_store: S3Store) -> None:
    """What a workload does: ``open_store(uri)`` with only the environment the controller passes."""
    code = (
        "import sys; from whale.store import open_store; s = open_store(sys.argv[1]); "
        "s.append_jsonl('m.jsonl', {'step': 1}); print(s.read_jsonl('m.jsonl'))"
    )
    env = {"PATH": os.environ.get("PATH", ""), **s3_server.env()}
    done = subprocess.run(
        [sys.executable, "-c", code, s3_store.uri],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert s3_store.read_jsonl("m.jsonl") == [{"step": 1}]


def test_bucket_is_created_on_first_write(s3_server: S3ServerInfo) -> None:
    bucket = f"fresh-{time.monotonic_ns() % 10**12}"
    store = s3_server.store(f"s3://{bucket}/p")
    assert store.list("") == []
    assert not store.exists("k")
    with pytest.raises(ObjectNotFound):
        store.read_bytes("k")
    store.write_json("k", {"v": 1})
    assert s3_server.store(f"s3://{bucket}").read_json("p/k") == {"v": 1}


def test_bucket_deleted_behind_our_back_is_recreated(s3_server: S3ServerInfo) -> None:
    bucket = f"vanishing-{time.monotonic_ns() % 10**12}"
    store = s3_server.store(f"s3://{bucket}")
    store.write_bytes("a", b"1")
    admin = Minio(s3_server.endpoint, access_key=s3_server.access_key, secret_key=s3_server.secret_key, secure=False)
    admin.remove_object(bucket, "a")
    admin.remove_bucket(bucket)
    store.write_bytes("b", b"2")
    assert store.list("") == ["b"]


def test_unknown_options_are_refused(s3_server: S3ServerInfo) -> None:
    with pytest.raises(StoreError, match="unknown S3 store option.*timeout"):
        s3_server.store("s3://whale-test/x", timeout=3)


def test_stores_with_different_prefixes_do_not_see_each_other(s3_server: S3ServerInfo) -> None:
    a = s3_server.store("s3://whale-test/iso/a")
    ab = s3_server.store("s3://whale-test/iso/ab")
    a.write_bytes("k", b"a")
    ab.write_bytes("k", b"ab")
    assert a.list("") == ["k"] and a.read_bytes("k") == b"a"
    assert s3_server.store("s3://whale-test/iso").list("", recursive=False) == ["a/", "ab/"]


def test_server_gone_gives_unavailable_then_data_is_intact(s3_private_server: SeaweedServer) -> None:
    server = s3_private_server
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the real wait, recorded: what the store chose to wait, whatever the load
        waits.append(seconds)
        time.sleep(seconds)

    store = server.info.store("s3://whale-test/outage", retry_deadline_s=2.0, sleep=sleep)
    store.write_json("runs/r/status.json", {"phase": "Running", "v": 1})
    store.append_jsonl("runs/r/metrics.jsonl", {"step": 1})

    server.kill()
    for op in (
        lambda: store.write_json("runs/r/status.json", {"phase": "Running", "v": 2}),
        lambda: store.read_bytes("runs/r/status.json"),
        lambda: store.append_jsonl("runs/r/metrics.jsonl", {"step": 2}),
        lambda: store.list("runs"),
    ):
        waits.clear()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            op()
        elapsed = time.monotonic() - started
        assert info.value.attempts > 1 and len(waits) == info.value.attempts - 1, "connection errors must be retried"
        # the budget: the waits between tries fill most of the 2 s and never more (exact, not a wall-clock bound);
        # the wall clock only shows that it gave up instead of hanging (a loaded machine makes tries slower)
        assert 0.5 < sum(waits) <= 2.0, f"retry budget of 2 s not respected: waited {waits}"
        assert elapsed < 2.0 + 30, f"gave up only after {elapsed:.1f}s"
        assert server.endpoint in str(info.value) and "WHALE_S3_ENDPOINT" in str(info.value)

    server.start()
    assert store.read_json("runs/r/status.json") == {"phase": "Running", "v": 1}
    assert store.read_jsonl("runs/r/metrics.jsonl") == [{"step": 1}]
    assert store.list("runs") == ["runs/r/metrics.jsonl", "runs/r/status.json"]


class _RetrySignal(logging.Handler):
    """Sets an event once the store has logged ``count`` retries."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count
        self.seen = 0
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "retry" in record.getMessage():
            self.seen += 1
            if self.seen >= self.count:
                self.event.set()


def test_server_back_within_the_budget_means_success(s3_private_server: SeaweedServer) -> None:
    server = s3_private_server
    store = server.info.store("s3://whale-test/blip", retry_deadline_s=60.0)
    store.write_bytes("before", b"1")
    server.kill()

    signal = _RetrySignal(count=2)
    logger = logging.getLogger("whale.store.s3")
    logger.addHandler(signal)
    outcome: list[object] = []

    def write() -> None:
        try:
            store.write_bytes("during", b"written across an outage")
            outcome.append("ok")
        except BaseException as exc:  # noqa: BLE001 - the outcome under test, whatever it is
            outcome.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        assert signal.event.wait(timeout=30), "the write did not retry while the server was down"
        server.start()
        thread.join(timeout=60)
    finally:
        logger.removeHandler(signal)
    assert outcome == ["ok"]
    assert store.read_bytes("during") == b"written across an outage"
    assert store.read_bytes("before") == b"1"


class FaultyProxy:
    """A real TCP proxy on loopback in front of the S3 server that injects faults per connection.

    ``plan`` holds one action per accepted connection (then "pass"): ``"503"`` answers the request
    with an S3 ``SlowDown`` error and closes; ``("cut", n)`` forwards ``n`` request bytes upstream,
    then drops both sides (a network failure in the middle of an upload)."""

    SLOW_DOWN = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        b"<Message>Please reduce your request rate.</Message></Error>"
    )

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.plan: list[object] = []
        self.connections = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closing = True
        self.server.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            action = self.plan.pop(0) if self.plan else "pass"
            threading.Thread(target=self._serve, args=(conn, action), daemon=True).start()

    def _serve(self, client: socket.socket, action: object) -> None:
        with client:
            if action == "503":
                head = b""
                while b"\r\n\r\n" not in head:
                    head += client.recv(65536)
                head, _, body = head.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length:
                    body += client.recv(65536)
                client.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(self.SLOW_DOWN), self.SLOW_DOWN)
                )
                return
            budget = action[1] if isinstance(action, tuple) else None
            with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                back = threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True)
                back.start()
                self._pipe(client, upstream, budget)
                for sock in (client, upstream):  # a cut drops both sides at once
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                back.join(timeout=10)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, budget: int | None) -> None:
        sent = 0
        try:
            while budget is None or sent < budget:
                data = src.recv(65536 if budget is None else min(65536, budget - sent))
                if not data:
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


@pytest.fixture
def faulty_proxy(s3_server: S3ServerInfo) -> Iterator[FaultyProxy]:
    proxy = FaultyProxy(int(s3_server.endpoint.rsplit(":", 1)[1]))
    yield proxy
    proxy.close()


def test_5xx_answers_are_retried(s3_server: S3ServerInfo, s3_store: S3Store, faulty_proxy: FaultyProxy) -> None:
    s3_store.write_bytes("k", b"value")
    sleeps: list[float] = []
    via_proxy = s3_server.store(s3_store.uri, endpoint=faulty_proxy.url, region="us-east-1", sleep=sleeps.append)
    faulty_proxy.plan = ["503", "503"]
    assert via_proxy.read_bytes("k") == b"value"
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0], "two SlowDown answers, two growing backoffs"
    assert faulty_proxy.connections == 3


def test_5xx_until_the_deadline_is_unavailable(
    s3_server: S3ServerInfo, s3_store: S3Store, faulty_proxy: FaultyProxy
) -> None:
    via_proxy = s3_server.store(s3_store.uri, endpoint=faulty_proxy.url, region="us-east-1", retry_deadline_s=0.5)
    faulty_proxy.plan = ["503"] * 100
    with pytest.raises(StoreUnavailable, match="SlowDown"):
        via_proxy.read_bytes("k")


def test_upload_cut_midway_is_retried_and_never_half_visible(
    s3_server: S3ServerInfo,
    s3_store: S3Store,
    faulty_proxy: FaultyProxy,
) -> None:
    size = 8 * 1024 * 1024
    s3_store.write_bytes("ckpt.bin", b"\x01" * size)
    seen_between_attempts: list[bytes] = []

    def sleep(_delay: float) -> None:  # runs between the cut attempt and its retry
        seen_between_attempts.append(s3_store.read_bytes("ckpt.bin"))

    via_proxy = s3_server.store(s3_store.uri, endpoint=faulty_proxy.url, region="us-east-1", sleep=sleep)
    faulty_proxy.plan = [("cut", 2 * 1024 * 1024)]  # the connection dies a quarter into the PUT
    via_proxy.write_bytes("ckpt.bin", b"\x02" * size)
    assert len(seen_between_attempts) == 1, "the cut upload must be retried once"
    assert seen_between_attempts[0] == b"\x01" * size, "after a cut upload the old object is intact"
    assert s3_store.read_bytes("ckpt.bin") == b"\x02" * size


# ----- pure pieces of whale.store.s3 ---------------------------------------------------------------------


def test_parse_s3_uri() -> None:
    assert parse_s3_uri("s3://bucket") == ("bucket", "")
    assert parse_s3_uri("s3://bucket/a//b/") == ("bucket", "a/b")
    with pytest.raises(StoreError, match="not a valid bucket name"):
        parse_s3_uri("s3://Bad_Bucket/x")
    with pytest.raises(StoreError, match="escapes"):
        parse_s3_uri("s3://bucket/../x")


def test_resolve_config_arguments_win_over_environment() -> None:
    env = {
        ENV_ENDPOINT: "https://s3.example:9000",
        ENV_ACCESS_KEY: "env-a",
        ENV_SECRET_KEY: "env-s",
        "AWS_REGION": "eu-west-1",
    }
    cfg = resolve_config(env=env)
    assert (cfg.endpoint, cfg.secure, cfg.access_key, cfg.region) == ("s3.example:9000", True, "env-a", "eu-west-1")
    cfg = resolve_config(endpoint="minio:9000", access_key="arg-a", secret_key="arg-s", secure=True, env=env)
    assert (cfg.endpoint, cfg.secure, cfg.access_key, cfg.secret_key) == ("minio:9000", True, "arg-a", "arg-s")
    assert "arg-s" not in repr(cfg)
    # a scheme in the endpoint says what the server speaks, whatever `secure` says
    assert resolve_config(endpoint="http://minio:9000", secure=True, env=env).secure is False
    bare = {**env, ENV_ENDPOINT: "minio:9000"}
    assert resolve_config(env=bare).secure is False
    assert resolve_config(env={**bare, "WHALE_S3_SECURE": "true"}).secure is True
    assert resolve_config(secure=False, env={**bare, "WHALE_S3_SECURE": "true"}).secure is False
    with pytest.raises(StoreError, match="WHALE_S3_SECURE"):
        resolve_config(env={**bare, "WHALE_S3_SECURE": "maybe"})
    with pytest.raises(StoreError, match="no path"):
        resolve_config(endpoint="http://minio:9000/bucket", env=env)
    with pytest.raises(StoreError, match="scheme"):
        resolve_config(endpoint="ftp://minio:9000", env=env)


def test_retry_policy_backs_off_exponentially_up_to_a_cap() -> None:
    policy = RetryPolicy(initial_delay_s=0.1, multiplier=2.0, max_delay_s=1.0, jitter=0.5)
    assert [policy.delay_s(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert policy.delay_s(3, u=0.0) == pytest.approx(0.2)  # the most jitter halves the delay


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _refused() -> Exception:
    return urllib3.exceptions.NewConnectionError(None, "Connection refused")  # type: ignore[arg-type]  # no connection object in a double


def test_call_with_retry_gives_up_at_the_deadline() -> None:
    clock = _FakeClock()
    calls = []

    def fail() -> None:
        calls.append(clock.now)
        raise _refused()

    policy = RetryPolicy(initial_delay_s=1.0, multiplier=2.0, max_delay_s=8.0, deadline_s=20.0, jitter=0.0)
    with pytest.raises(StoreUnavailable, match="http://h:1 unavailable: read of k failed 5 time") as info:
        call_with_retry(
            fail,
            policy=policy,
            what="read of k",
            endpoint="http://h:1",
            clock=clock,
            sleep=clock.sleep,
            rand=lambda: 1.0,
        )
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0]  # a further 8 s would end after the 20 s deadline
    assert calls == [0.0, 1.0, 3.0, 7.0, 15.0]
    assert info.value.attempts == 5 and info.value.elapsed_s == 15.0


def test_call_with_retry_returns_once_the_server_answers() -> None:
    clock = _FakeClock()
    answers: list[Exception | str] = [_refused(), _refused(), "value"]

    def flaky() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert (
        call_with_retry(flaky, policy=RetryPolicy(jitter=0.0), what="x", endpoint="e", clock=clock, sleep=clock.sleep)
        == "value"
    )
    assert len(clock.sleeps) == 2


def test_call_with_retry_does_not_retry_permanent_errors() -> None:
    clock = _FakeClock()

    def bad() -> None:
        raise ValueError("not an I/O problem")

    with pytest.raises(ValueError):
        call_with_retry(bad, policy=RetryPolicy(), what="x", endpoint="e", clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []


def test_classify_transport_errors() -> None:
    assert classify(_refused()) == ErrorKind.TRANSIENT
    assert classify(urllib3.exceptions.ProtocolError("connection reset")) == ErrorKind.TRANSIENT
    assert classify(ConnectionResetError()) == ErrorKind.TRANSIENT
    assert classify(KeyError("x")) == ErrorKind.PERMANENT


def _s3_error(status: int, code: str) -> S3Error:
    return S3Error(urllib3.HTTPResponse(status=status), code, "msg", "/b/k", "req", "host")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_s3_error(503, "SlowDown"), ErrorKind.TRANSIENT),
        (_s3_error(500, "InternalError"), ErrorKind.TRANSIENT),
        (_s3_error(503, "SomethingNew"), ErrorKind.TRANSIENT),
        (_s3_error(403, "SignatureDoesNotMatch"), ErrorKind.AUTH),
        (_s3_error(403, "InvalidAccessKeyId"), ErrorKind.AUTH),
        (_s3_error(403, "AccessDenied"), ErrorKind.AUTH),
        (_s3_error(404, "NoSuchKey"), ErrorKind.NOT_FOUND),
        (_s3_error(400, "InvalidArgument"), ErrorKind.PERMANENT),
        (ServerError("server failed with HTTP status code 502", 502), ErrorKind.TRANSIENT),
        (InvalidResponseError(504, "text/html", "<html>gateway timeout</html>"), ErrorKind.TRANSIENT),
        (InvalidResponseError(400, "text/html", "<html>bad</html>"), ErrorKind.PERMANENT),
    ],
)
def test_classify_server_answers(exc: Exception, kind: str) -> None:
    assert classify(exc) == kind


# ----- the run lock: one live holder (both backends), expiry and take-over (S3) --------------------------

LOCK = "runs/r1/control/lock.json"


def test_the_run_lock_admits_one_holder_and_names_it(store: Store) -> None:
    first = store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    info = store.read_lease(LOCK)
    assert info is not None and info.live and info.holder.owner == first.holder.owner
    with pytest.raises(LeaseHeld) as refused:
        store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    assert f"pid {os.getpid()} on host {socket.gethostname()} (whale run r1)" in str(refused.value)
    assert store.uri_for(LOCK) in str(refused.value)
    first.renew()
    first.check()
    first.release()
    first.release()
    after = store.read_lease(LOCK)
    assert after is None or not after.live
    second = store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    assert store.read_lease(LOCK).holder.owner == second.holder.owner
    second.release()


def test_an_s3_lease_not_renewed_expires_and_is_taken_over(s3_store: S3Store) -> None:
    stale = s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=1.5)
    with pytest.raises(LeaseHeld):
        s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)  # live: refused, no waiting
    deadline = time.monotonic() + 20
    while True:
        try:
            taker = s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
            break
        except LeaseHeld as exc:
            assert time.monotonic() < deadline, f"the stale lease never expired: {exc}"
            time.sleep(0.1)
    with pytest.raises(LeaseLost, match="could not renew"):
        stale.renew()  # its holder knows it is past its lifetime without asking the server
    stale.release()  # a lost lease is left to its new holder
    assert s3_store.read_lease(LOCK).holder.owner == taker.holder.owner
    taker.release()
    assert s3_store.read_lease(LOCK) is None


def test_an_s3_lease_taken_over_under_its_holder_is_lost_at_the_next_renewal(s3_store: S3Store) -> None:
    """A holder whose clock lags sees its lease taken over while it still thinks it valid: the conditional
    renewal fails, and it must not write over the new holder."""
    mine = s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
    other = this_process("whale run r1").renewed(time.time(), 60)
    s3_store.write_json(LOCK, other.to_wire())  # what another runner's take-over leaves
    with pytest.raises(LeaseLost, match=f"taken over by pid {os.getpid()}"):
        mine.renew()
    with pytest.raises(LeaseLost):
        mine.check()
    mine.release()
    assert s3_store.read_lease(LOCK).holder.owner == other.owner


def test_an_s3_lease_kept_alive_outlives_its_ttl(s3_store: S3Store) -> None:
    ttl = 1.5
    with s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=ttl).keep_alive() as lease:
        end = time.monotonic() + 3 * ttl
        while time.monotonic() < end:  # across several lifetimes, every attempt to take it is refused
            with pytest.raises(LeaseHeld):
                s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)
            lease.check()
            time.sleep(0.2)
    assert s3_store.read_lease(LOCK) is None  # keep_alive released it


def test_an_s3_lease_that_cannot_be_renewed_is_given_up_before_it_expires(s3_store: S3Store) -> None:
    lease = s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=1.2)
    deadline = time.monotonic() + 10
    while True:  # nobody renews it: its holder must notice before another runner may take it
        try:
            lease.check()
        except LeaseLost as exc:
            assert "could not renew" in str(exc)
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert s3_store.read_lease(LOCK).holder.expired(time.time() + 0.5)


def test_an_s3_lease_of_a_dead_process_here_is_taken_over_at_once_elsewhere_it_is_not(s3_store: S3Store) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=30, check=True
    )
    dead = replace(this_process("whale run r1"), pid=int(gone.stdout), pid_start=None)
    s3_store.acquire_lease(LOCK, dead, ttl_s=600)  # never released: its runner was SIGKILLed
    assert s3_store.read_lease(LOCK).live is False
    s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60).release()

    elsewhere = replace(this_process("whale run r1"), pid=1, machine="another-machine/pid:[1]")
    s3_store.acquire_lease(LOCK, elsewhere, ttl_s=600)
    assert machine_id() != elsewhere.machine
    with pytest.raises(LeaseHeld, match="lease expires"):
        s3_store.acquire_lease(LOCK, this_process("whale run r1"), ttl_s=60)


# ----- writes the store refuses name the object, the cause and the fix ----------------------------------


class _ReadOnlyKeyServer(SeaweedServer):
    """A server with a second identity that may read and list but not write."""

    READER = ("whale-reader", "reader-secret-0123456789")

    def command(self) -> list[str]:
        config = self.data_dir / "s3-identities.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "List", "Write", "Tagging"],
                        },
                        {
                            "name": "reader",
                            "credentials": [{"accessKey": self.READER[0], "secretKey": self.READER[1]}],
                            "actions": ["Read", "List"],
                        },
                    ]
                }
            )
        )
        return [*super().command(), f"-s3.config={config}"]


def test_a_write_the_server_denies_names_the_object_and_the_fix(tmp_path: Path) -> None:
    server = _ReadOnlyKeyServer(tmp_path / "seaweedfs")
    server.start()
    try:
        server.info.store("s3://whale-test/ro").write_bytes("runs/r/status.json", b"{}")
        reader = S3Store.from_uri(
            "s3://whale-test/ro",
            endpoint=server.info.url,
            access_key=server.READER[0],
            secret_key=server.READER[1],
            retry_deadline_s=5.0,
        )
        assert reader.read_bytes("runs/r/status.json") == b"{}"
        for write in (
            lambda: reader.write_bytes("runs/r/status.json", b"[]"),
            lambda: reader.delete("runs/r/status.json"),
        ):
            with pytest.raises(StoreWriteDenied) as denied:
                write()
            assert isinstance(denied.value, StoreReadOnly) and isinstance(denied.value, StoreAuthError)
            message = str(denied.value)
            assert "s3://whale-test/ro/runs/r/status.json" in message and "AccessDenied" in message
            assert "'whale-reader'" in message and "Fix: give that key write access" in message
            assert server.READER[1] not in message
    finally:
        server.kill()


@pytest.mark.parametrize("code", ["XMinioStorageFull", "QuotaExceeded", "InsufficientStorage"])
def test_a_full_store_or_quota_is_permanent_and_names_the_object(s3_store: S3Store, code: str) -> None:
    assert classify(_s3_error(507 if code == "InsufficientStorage" else 403, code)) == ErrorKind.FULL
    assert classify(ServerError("server failed with HTTP status code 507", 507)) == ErrorKind.FULL
    calls = []

    def full() -> None:
        calls.append(1)
        raise _s3_error(507, code)

    where = s3_store.uri_for("runs/r/checkpoints/step-000001/model.safetensors")
    with pytest.raises(StoreFull) as refused:
        s3_store._call(f"write of {where}", full, writing=where)
    assert calls == [1], "a full store is not retried"
    assert refused.value.uri == where and code in str(refused.value) and "Fix: free space" in str(refused.value)


def test_a_connection_the_server_saw_cut_is_retried() -> None:
    """SeaweedFS may answer an upload whose connection died mid-body with ClientDisconnected (HTTP 400)."""
    assert classify(_s3_error(400, "ClientDisconnected")) == ErrorKind.TRANSIENT
