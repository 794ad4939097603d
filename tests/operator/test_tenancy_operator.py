"""Tenant-safe storage through the real operator: a run's data lives under <storage.uri>/<namespace>/<name>.<uid>,
so a re-created run starts clean, two namespaces never share a run's data, resumeFrom adopts an earlier run's
store, and a store outside the operator's allow-list is refused before anything is created."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kopf.testing import KopfRunner

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.conftest import BASE_SPEC, deep_merge, prepared_run
from tests.operator.player import WR, WorkloadPlayer
from whale.core import layout
from whale.store import Store

pytestmark = pytest.mark.timeout(120)


def new_run(api: Any, store: Store, namespace: str, name: str, spec: dict[str, Any] | None = None) -> WorkloadPlayer:
    full = deep_merge(deep_merge(BASE_SPEC, {"storage": {"uri": store.uri}}), spec or {})
    return prepared_run(api, store, namespace, name, full)


def test_a_recreated_run_starts_clean_and_resume_from_adopts_the_old_store(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store: Store
):
    api = kube_cluster.api
    with start_operator():
        first = new_run(api, store, kube_namespace, "again")
        first.finish(first.wait_job())  # start evaluation
        first.finish(first.wait_job())  # c01-weight
        done = wait_for(
            lambda: "c01-weight" in first.status().get("completedPhases", []) and first.status(),
            what="c01-weight completed",
        )
        old_uri, old_uid = done["storeUri"], first.wr()["metadata"]["uid"]
        assert old_uri == f"{store.uri}/{kube_namespace}/again.{old_uid}"
        api.delete(WR, "whaleruns", kube_namespace, "again")
        wait_for(lambda: api.get(WR, "whaleruns", kube_namespace, "again") is None, what="the WhaleRun to go")

        # the same name again: its own store, nothing inherited (before: the old phases and best at once)
        second = new_run(api, store, kube_namespace, "again")
        job = second.wait_job()
        assert job["metadata"]["name"] == "again-eval-c00-s000000-start-1"
        st = second.status()
        assert st.get("completedPhases", []) == [] and st.get("best") is None
        assert st["storeUri"] != old_uri and st["storeUri"].endswith(second.wr()["metadata"]["uid"])
        # the old run's data is still where it was (nothing is deleted for the new one)
        assert first.store.exists(layout.result_key("again", "c01-weight"))
        api.delete(WR, "whaleruns", kube_namespace, "again")
        wait_for(lambda: api.get(WR, "whaleruns", kube_namespace, "again") is None, what="the WhaleRun to go")

        # resumeFrom: the first run's store is adopted, with its completed phases
        third = new_run(api, store, kube_namespace, "again", {"resumeFrom": old_uid})
        assert third.store.uri == old_uri
        resumed = wait_for(
            lambda: "c01-weight" in third.status().get("completedPhases", []) and third.status(),
            what="the adopted run's completed phases",
        )
        assert resumed["storeUri"] == old_uri


def test_two_namespaces_with_the_same_run_name_never_share_data(
    operator_env: None, kube_cluster: EmulatedCluster, kube_namespace: str, store: Store, monkeypatch
):
    api = kube_cluster.api
    other = f"{kube_namespace[:50]}-b"
    api.create("v1", "namespaces", None, {"metadata": {"name": other}})
    monkeypatch.setenv("WHALE_OPERATOR_NAMESPACES", f"{kube_namespace},{other}")  # as kopf's two --namespace
    args = ["run", "--standalone", "--namespace", kube_namespace, "--namespace", other, "-m", "whale_operator.handlers"]
    with KopfRunner(args, timeout=30) as runner:
        a = new_run(api, store, kube_namespace, "same")
        b = new_run(api, store, other, "same")
        a.finish(a.wait_job())
        a.finish(a.wait_job())  # a: start evaluation and c01-weight done
        wait_for(lambda: "c01-weight" in a.status().get("completedPhases", []), what="a's weight phase")
        assert a.store.uri != b.store.uri
        assert a.status()["storeUri"].startswith(f"{store.uri}/{kube_namespace}/same.")
        wait_for(lambda: b.status().get("storeUri"), what="b's status")
        assert b.status()["storeUri"].startswith(f"{store.uri}/{other}/same.")
        # b has done nothing: a's phases are not b's
        assert b.status().get("completedPhases", []) == []
        assert not b.store.exists(layout.result_key("same", "c01-weight"))
        assert b.wait_job()["metadata"]["name"] == "same-eval-c00-s000000-start-1"
    assert runner.exception is None, runner.output[-4000:]


def test_a_store_outside_the_allow_list_is_refused_naming_the_field(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store: Store, monkeypatch
):
    monkeypatch.setenv("WHALE_ALLOWED_STORES", f"file:///allowed-{uuid.uuid4().hex[:6]}")
    api = kube_cluster.api
    with start_operator():
        run = new_run(api, store, kube_namespace, "outside")
        st = wait_for(lambda: run.status().get("reason") == "InvalidSpec" and run.status(), what="InvalidSpec")
        assert "spec.execution.storage.uri" in st["message"] and "WHALE_ALLOWED_STORES" in st["message"]
        assert run.jobs() == []
