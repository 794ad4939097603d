"""Each run's store is opened with the run's OWN credentials (its namespace's Secret named by
``spec.execution.storage.credentialsSecret``), read through the Kubernetes API (the emulator), against the real S3 server:
never with the operator's own keys unless the operator allows it, a rotated Secret picked up, a missing one a
wait that names the field and the fix."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.fixtures.s3 import TEST_BUCKET, S3ServerInfo
from tests.operator.conftest import BASE_SPEC, deep_merge, prepared_run
from tests.operator.player import WR
from whale.store.base import StoreAuthError
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.config import OperatorConfig
from whale_operator.credentials import CredentialsUnavailable, RunStores, StoreCredentials, credentials_from_secret
from whale_operator.kube import KubeClient, Refused

pytestmark = pytest.mark.timeout(120)


def secret(name: str, values: dict[str, str]) -> dict[str, Any]:
    data = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque", "data": data}


def s3_spec(s3: S3ServerInfo, secret_name: str | None, prefix: str) -> ClusterRunSpec:
    storage: dict[str, Any] = {"uri": f"s3://{TEST_BUCKET}/{prefix}", "endpoint": s3.url}
    if secret_name:
        storage["credentialsSecret"] = secret_name
    return ClusterRunSpec.model_validate(deep_merge(BASE_SPEC, {"storage": storage}))


@pytest.fixture()
def kube(kube_cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    client = KubeClient.from_environment()
    yield client
    client.close()


def test_each_namespace_s_run_gets_its_own_secret_s_credentials(
    kube, kube_cluster: EmulatedCluster, kube_namespace: str, s3_server: S3ServerInfo, monkeypatch
):
    # the operator's own environment holds VALID keys: they must not be what opens a run's store
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    api = kube_cluster.api
    good_ns, bad_ns = kube_namespace, f"{kube_namespace[:50]}-b"
    api.create("v1", "namespaces", None, {"metadata": {"name": bad_ns}})
    valid = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    api.create("v1", "secrets", good_ns, secret("store-keys", valid))
    wrong = {"AWS_ACCESS_KEY_ID": "someone-else", "AWS_SECRET_ACCESS_KEY": "not-the-key"}
    api.create("v1", "secrets", bad_ns, secret("store-keys", wrong))
    prefix = f"creds-{uuid.uuid4().hex[:8]}"
    now = [0.0]
    stores = RunStores(kube, OperatorConfig.from_env().store_options, recheck_s=30.0, clock=lambda: now[0])

    good = stores.open(good_ns, s3_spec(s3_server, "store-keys", f"{prefix}/a"))
    good.write_json("probe.json", {"ok": True})
    assert good.read_json("probe.json") == {"ok": True}
    assert good.config.access_key == s3_server.access_key  # type: ignore[attr-defined]  # an S3Store

    bad = stores.open(bad_ns, s3_spec(s3_server, "store-keys", f"{prefix}/b"))
    assert bad.config.access_key == "someone-else"  # type: ignore[attr-defined]  # the namespace's key, not ours
    with pytest.raises(StoreAuthError):
        bad.write_json("probe.json", {"ok": True})

    # the same Secret again: the cached store; rotated (a new resourceVersion): a new store with the new keys once the
    # Secret is read again (recheck_s after it was read), or at once after the store refused the keys held
    assert stores.open(bad_ns, s3_spec(s3_server, "store-keys", f"{prefix}/b")) is bad
    api.patch("v1", "secrets", bad_ns, "store-keys", {"data": secret("x", valid)["data"]})
    now[0] = 29.0
    assert stores.open(bad_ns, s3_spec(s3_server, "store-keys", f"{prefix}/b")) is bad, "read 29 s ago: held"
    now[0] = 30.0
    rotated = stores.open(bad_ns, s3_spec(s3_server, "store-keys", f"{prefix}/b"))
    assert rotated is not bad
    rotated.write_json("probe.json", {"ok": True})
    assert rotated.read_json("probe.json") == {"ok": True}
    api.patch("v1", "secrets", bad_ns, "store-keys", {"data": secret("x", wrong)["data"]})
    assert stores.open(bad_ns, s3_spec(s3_server, "store-keys", f"{prefix}/b")) is rotated, "held until refused"
    stores.forget_credentials(bad_ns, "store-keys")
    assert stores.open(bad_ns, s3_spec(s3_server, "store-keys", f"{prefix}/b")).config.access_key == "someone-else"  # type: ignore[attr-defined]


def test_a_secret_is_read_once_per_recheck_not_at_every_open(
    kube, kube_cluster: EmulatedCluster, kube_namespace: str, s3_server: S3ServerInfo
):
    """A run reconciled every few seconds does not cost a Secret read each time: one read per ``recheck_s`` (counted
    at the API server); a Secret that cannot be used yet is read again at every open, so the run starts once fixed."""
    api = kube_cluster.api
    api.create("v1", "secrets", kube_namespace, secret("held", {"AWS_ACCESS_KEY_ID": "k"}))
    now = [0.0]
    stores = RunStores(kube, recheck_s=30.0, clock=lambda: now[0])
    spec = s3_spec(s3_server, "held", f"held-{uuid.uuid4().hex[:8]}")

    def secret_reads() -> int:
        return sum(
            1
            for r in kube_cluster.emulator._requests
            if str(r.method).upper().endswith("GET") and r.url.path.endswith("/secrets/held")
        )

    for _ in range(3):  # incomplete: read again each time
        with pytest.raises(CredentialsUnavailable):
            stores.open(kube_namespace, spec)
    assert secret_reads() == 3
    valid = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    api.patch("v1", "secrets", kube_namespace, "held", {"data": secret("x", valid)["data"]})
    store = stores.open(kube_namespace, spec)
    for t in (1.0, 10.0, 29.9):
        now[0] = t
        assert stores.open(kube_namespace, spec) is store
    assert secret_reads() == 4, "one read for the usable Secret, then none within recheck_s"
    now[0] = 30.0
    assert stores.open(kube_namespace, spec) is store, "read again, the same resourceVersion: the same store"
    assert secret_reads() == 5


def test_a_missing_or_incomplete_secret_names_the_field_and_the_fix(
    kube, kube_cluster: EmulatedCluster, kube_namespace: str, s3_server: S3ServerInfo
):
    stores = RunStores(kube)
    spec = s3_spec(s3_server, "absent", "never")
    with pytest.raises(CredentialsUnavailable) as missing:
        stores.open(kube_namespace, spec)
    assert "spec.execution.storage.credentialsSecret" in str(missing.value)
    assert f"{kube_namespace}/absent does not exist" in str(missing.value)
    kube_cluster.api.create("v1", "secrets", kube_namespace, secret("absent", {"AWS_ACCESS_KEY_ID": "k"}))
    with pytest.raises(CredentialsUnavailable, match="has no AWS_SECRET_ACCESS_KEY; add AWS_SECRET_ACCESS_KEY"):
        stores.open(kube_namespace, spec)


def test_credentials_never_print_and_string_data_counts():
    creds = credentials_from_secret(
        {"stringData": {"AWS_ACCESS_KEY_ID": "AKIA-visible?", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}}, "ns/s"
    )
    assert creds == StoreCredentials("AKIA-visible?", "s3cr3t-value")
    assert "s3cr3t-value" not in repr(creds) and "AKIA" not in repr(creds)


@pytest.mark.parametrize(
    "env, uri, secret_name, refused",
    [
        ({}, "s3://b/p", None, True),  # a shared install: no Secret, no store
        ({"WHALE_OPERATOR_OWN_STORE_CREDENTIALS": "1"}, "s3://b/p", None, False),  # single-tenant / dev overlay
        ({}, "s3://b/p", "keys", False),
        ({}, "file:///data/runs", None, False),  # a folder store needs no credentials
    ],
)
def test_the_operator_lends_its_own_credentials_only_where_allowed(env, uri, secret_name, refused):
    storage = {"uri": uri, "endpoint": "minio:9000", **({"credentialsSecret": secret_name} if secret_name else {})}
    spec = ClusterRunSpec.model_validate(deep_merge(BASE_SPEC, {"storage": storage}))
    problems = OperatorConfig.from_env(env).credentials_problems(spec)
    assert bool(problems) is refused
    if refused:
        assert problems[0][0] == "spec.execution.storage.credentialsSecret"
        assert "WHALE_OPERATOR_OWN_STORE_CREDENTIALS" in problems[0][1]


def test_a_run_waits_for_its_secret_then_starts(start_operator, kube_cluster: EmulatedCluster, kube_namespace, store):
    api = kube_cluster.api
    spec = deep_merge(BASE_SPEC, {"storage": {"uri": store.uri, "credentialsSecret": "run-keys"}})
    with start_operator():
        run = prepared_run(api, store, kube_namespace, "keyed", spec)
        st = wait_for(lambda: run.status().get("reason") == "WaitingForCredentials" and run.status(), what="a wait")
        assert (
            "spec.execution.storage.credentialsSecret" in st["message"] and "run-keys does not exist" in st["message"]
        )
        assert st.get("phase") != "Failed" and run.jobs() == []
        progressing = next(c for c in st["conditions"] if c["type"] == "Progressing")
        assert "spec.execution.storage.credentialsSecret" in progressing["message"]
        values = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
        api.create("v1", "secrets", kube_namespace, secret("run-keys", values))
        job = run.wait_job()  # polled, not watched: within the progress interval
        assert job["metadata"]["name"] == "keyed-eval-c00-s000000-start-1"
        assert run.status().get("reason") != "WaitingForCredentials"


def test_keys_the_store_refuses_make_the_run_wait_naming_the_secret(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, s3_server: S3ServerInfo, monkeypatch
):
    monkeypatch.setenv("WHALE_ALLOWED_S3_ENDPOINTS", s3_server.endpoint)  # the admin's allow-list (on by default)
    api = kube_cluster.api
    wrong = {"AWS_ACCESS_KEY_ID": "someone-else", "AWS_SECRET_ACCESS_KEY": "not-the-key"}
    api.create("v1", "secrets", kube_namespace, secret("bad-keys", wrong))
    storage = {
        "uri": f"s3://{TEST_BUCKET}/refused-{uuid.uuid4().hex[:8]}",
        "endpoint": s3_server.url,
        "credentialsSecret": "bad-keys",
    }
    body = {
        "apiVersion": WR,
        "kind": "WhaleRun",
        "metadata": {"name": "refused"},
        "spec": deep_merge(BASE_SPEC, {"storage": storage}),
    }
    with start_operator():
        api.create(WR, "whaleruns", kube_namespace, body)
        st = wait_for(
            lambda: (
                (s := api.get(WR, "whaleruns", kube_namespace, "refused").get("status") or {}).get("reason")
                == "WaitingForCredentials"
                and s
            ),
            what="the refusal in status",
        )
        assert "spec.execution.storage.credentialsSecret: the store refused Secret bad-keys's keys" in st["message"]
        assert "not-the-key" not in st["message"]
        valid = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
        api.patch("v1", "secrets", kube_namespace, "bad-keys", {"data": secret("x", valid)["data"]})
        # the rotated Secret is used: the run leaves the wait (its data preparation starts)
        wait_for(
            lambda: (
                (api.get(WR, "whaleruns", kube_namespace, "refused").get("status") or {}).get("reason")
                not in (None, "WaitingForCredentials")
            ),
            what="the run to go on with the rotated keys",
        )


class _ForbiddenKube:
    """Our boundary, not the transport: the API server answering 403 to the Secret's read (RBAC without
    ``secrets: get`` in this namespace)."""

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise Refused(
            403, f'secrets "{name}" is forbidden: User "system:serviceaccount:whale-system:whale-operator" cannot get'
        )


def test_a_secret_the_operator_may_not_read_names_the_rbac_fix(s3_server: S3ServerInfo):
    stores = RunStores(_ForbiddenKube())  # type: ignore[arg-type]  # the one method RunStores calls
    with pytest.raises(CredentialsUnavailable) as refused:
        stores.open("team-a", s3_spec(s3_server, "keys", "never"))
    text = str(refused.value)
    assert "spec.execution.storage.credentialsSecret" in text and "may not read Secret team-a/keys (HTTP 403" in text
    assert "`get` on secrets" in text


@pytest.mark.parametrize("bad", ["-1", "soon", "inf", "nan"])
def test_a_bad_secret_recheck_setting_names_the_variable(bad: str) -> None:
    """``WHALE_OPERATOR_SECRET_RECHECK_S`` is read at start-up: a value that is not seconds (0 or more, finite) is
    refused there, naming the variable and what to give; unset is 30 s, 0 reads the Secret at every reconcile."""
    with pytest.raises(ValueError, match=r"WHALE_OPERATOR_SECRET_RECHECK_S='.*': give a number of seconds, 0 or more"):
        OperatorConfig.from_env({"WHALE_OPERATOR_SECRET_RECHECK_S": bad})
    assert OperatorConfig.from_env({}).secret_recheck_s == 30.0
    assert OperatorConfig.from_env({"WHALE_OPERATOR_SECRET_RECHECK_S": "0"}).secret_recheck_s == 0.0
