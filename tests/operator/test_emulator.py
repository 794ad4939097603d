"""The compatibility layer over kmock: the API-server semantics the operator and kubectl rely on,
plus kubectl's view of a WhaleRun (printer columns) and the operator's metrics endpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading

import httpx
import pytest

from tests.fixtures.kube import APIError, EmulatedCluster, json_patch, label_match, merge_patch, wait_for


def test_metadata_generation_and_status_subresource(kube_cluster: EmulatedCluster, kube_namespace: str):
    api = kube_cluster.api
    made = api.create(
        "batch/v1",
        "jobs",
        kube_namespace,
        {"metadata": {"name": "j"}, "spec": {"parallelism": 1}, "status": {"active": 5}},
    )
    meta = made["metadata"]
    assert meta["namespace"] == kube_namespace and meta["generation"] == 1 and meta["uid"]
    assert made["kind"] == "Job" and made["apiVersion"] == "batch/v1" and "status" not in made
    rv = int(meta["resourceVersion"])
    st = api.patch(
        "batch/v1", "jobs", kube_namespace, "j", {"status": {"active": 1}, "spec": {"parallelism": 9}}, sub="status"
    )
    assert st["status"] == {"active": 1} and st["spec"]["parallelism"] == 1 and st["metadata"]["generation"] == 1
    sp = api.patch("batch/v1", "jobs", kube_namespace, "j", {"spec": {"parallelism": 2}, "status": {"active": 7}})
    assert sp["spec"]["parallelism"] == 2 and sp["status"] == {"active": 1} and sp["metadata"]["generation"] == 2
    assert int(sp["metadata"]["resourceVersion"]) > rv
    with pytest.raises(APIError) as exc:
        api.create("batch/v1", "jobs", kube_namespace, {"metadata": {"name": "j"}})
    assert exc.value.code == 409 and exc.value.reason == "AlreadyExists"


def test_json_patch_test_op_conflicts_like_the_api_server():
    doc = {"metadata": {"resourceVersion": "5", "finalizers": ["a"]}}
    assert (
        json_patch(
            doc,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ],
        )["metadata"]["finalizers"]
        == []
    )
    with pytest.raises(APIError) as exc:
        json_patch(doc, [{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}])
    assert exc.value.code == 422


def test_a_merge_patch_changes_neither_of_its_inputs():
    target = {"metadata": {"labels": {"a": "1"}}, "spec": {"x": [1, {"y": 2}]}}
    patch = {"metadata": {"labels": {"b": "2"}}, "spec": {"z": {"w": 3}}}
    out = merge_patch(target, patch)
    assert out == {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1, {"y": 2}], "z": {"w": 3}}}
    out["spec"]["x"][1]["y"] = 9
    out["spec"]["z"]["w"] = 9
    assert target["spec"]["x"][1] == {"y": 2} and patch["spec"]["z"] == {"w": 3}
    assert merge_patch(target, {"metadata": None}) == {"spec": {"x": [1, {"y": 2}]}}


def test_every_replayed_watch_event_holds_its_own_version(kube_cluster: EmulatedCluster, kube_namespace: str):
    """The events kept for a resumed watch are the versions as they were written: later writes of the same object
    (a merge patch, a status write, a JSON patch) leave them as they were."""
    api = kube_cluster.api
    made = api.create("batch/v1", "jobs", kube_namespace, {"metadata": {"name": "j", "labels": {"v": "1"}}})
    since = str(int(made["metadata"]["resourceVersion"]) - 1)
    api.patch("batch/v1", "jobs", kube_namespace, "j", {"metadata": {"labels": {"v": "2"}}})
    api.patch("batch/v1", "jobs", kube_namespace, "j", {"status": {"active": 1}}, sub="status")
    resp = httpx.patch(
        f"{kube_cluster.url}/apis/batch/v1/namespaces/{kube_namespace}/jobs/j",
        json=[{"op": "replace", "path": "/metadata/labels/v", "value": "3"}],
        headers={"Content-Type": "application/json-patch+json"},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    with httpx.stream(
        "GET",
        f"{kube_cluster.url}/apis/batch/v1/namespaces/{kube_namespace}/jobs",
        params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"},
        timeout=10,
    ) as stream:
        events = [json.loads(line) for line in stream.iter_lines()]
    seen = [(e["type"], e["object"]["metadata"]["labels"]["v"], e["object"].get("status")) for e in events]
    assert seen == [
        ("ADDED", "1", None),
        ("MODIFIED", "2", None),
        ("MODIFIED", "2", {"active": 1}),
        ("MODIFIED", "3", {"active": 1}),
    ]


def test_label_selectors():
    labels = {"a": "1", "b": "x"}
    assert label_match(labels, "a=1,b in (x,y)") and label_match(labels, "!c,a!=2")
    assert not label_match(labels, "b notin (x)") and not label_match(labels, "c")


def test_watch_resumes_from_resource_version_and_gc_cascades(kube_cluster: EmulatedCluster, kube_namespace: str):
    api = kube_cluster.api
    owner = api.create("v1", "configmaps", kube_namespace, {"metadata": {"name": "owner"}})
    since = owner["metadata"]["resourceVersion"]
    api.create(
        "v1",
        "configmaps",
        kube_namespace,
        {
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
                ],
            }
        },
    )
    events: list[dict] = []

    def watch() -> None:
        with httpx.stream(
            "GET",
            f"{kube_cluster.url}/api/v1/namespaces/{kube_namespace}/configmaps",
            params={"watch": "true", "resourceVersion": since, "timeoutSeconds": "2"},
        ) as resp:
            for line in resp.iter_lines():
                events.append(json.loads(line))

    t = threading.Thread(target=watch)
    t.start()
    wait_for(lambda: events, what="the replayed event")
    api.delete("v1", "configmaps", kube_namespace, "owner")
    t.join(timeout=10)
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events]
    # only what happened after `since` (no ADDED replay of the owner), then the cascade
    assert seen == [("ADDED", "child"), ("DELETED", "owner"), ("DELETED", "child")]
    assert api.list("v1", "configmaps", kube_namespace) == []


def test_kubectl_shows_printer_columns(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str, tmp_path
):
    # HOME: kubectl keeps a discovery cache under ~/.kube; keep it out of the user's (and the checkout's)
    env = {**os.environ, "KUBECONFIG": str(kube_cluster.kubeconfig), "HOME": str(tmp_path)}
    with start_operator():
        run = make_run("shown")
        run.finish(run.wait_job())
        wait_for(lambda: run.status().get("best"), what="a best score")
        out = subprocess.run(
            ["kubectl", "get", "wr", "-n", kube_namespace],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=True,
        ).stdout
        wide = subprocess.run(
            ["kubectl", "get", "whaleruns", "-n", kube_namespace, "-o", "wide"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=True,
        ).stdout
        waited = subprocess.run(
            [
                "kubectl",
                "wait",
                "-n",
                kube_namespace,
                "wr/shown",
                "--for=jsonpath={.status.phase}=Running",
                "--timeout=10s",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "CYCLE", "STAGE", "STEP", "BEST", "FINAL", "ROLLOUTS", "AGE"]
    assert row.split()[:6] == ["shown", "Running", "1", "weight", "0", "0.1"]
    assert row[header.index("FINAL") : header.index("ROLLOUTS")].strip() == ""  # final: once the run succeeds
    assert wide.splitlines()[0].split()[-3:] == ["DOMAIN", "CONDITION", "AGE"]
    assert "synthetic" in wide and "whale" in wide.splitlines()[1]
    assert waited.returncode == 0, waited.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_operator_exposes_prometheus_metrics(start_operator, make_run, monkeypatch: pytest.MonkeyPatch):
    port = _free_port()
    monkeypatch.setenv("WHALE_OPERATOR_METRICS_PORT", str(port))
    with start_operator():
        run = make_run("metered")
        run.finish(run.wait_job())
        run.wait_job()

        def scrape() -> str | None:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            return text if 'whale_operator_runs{phase="Running"} 1.0' in text else None

        text = wait_for(scrape, what="the runs gauge")
    assert 'whale_operator_handler_duration_seconds_count{handler="reconcile"}' in text
    assert 'whale_operator_children_created_total{kind="Job"} 2.0' in text
    assert 'whale_operator_actions_total{action="StartPhase"}' in text
    assert 'whale_operator_phase_duration_seconds_count{kind="eval",outcome="Succeeded"} 1.0' in text
    assert "whale_operator_reconcile_errors_total" not in text or "errors_total{" not in text
