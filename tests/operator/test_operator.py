"""The real operator (kopf) against the Kubernetes API emulator: the issue's scenarios.

The tests play the cluster's controllers and the workloads (tests/operator/player.py) and assert on
the objects, status, conditions and events through the API.
"""

from __future__ import annotations

import base64

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.player import WR
from whale.core import layout
from whale.core.protocol import WeightRequest
from whale_operator import names

pytestmark = pytest.mark.timeout(120)


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status.get("conditions", [])}


def events(api, namespace: str, run: str) -> list[tuple[str, str]]:
    return [
        (e["type"], e["reason"])
        for e in api.list("v1", "events", namespace)
        if e.get("involvedObject", {}).get("name") == run
    ]


def test_whale_run_two_cycles(start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str):
    api = kube_cluster.api
    with start_operator():
        run = make_run("two-cycles")
        first = run.wait_job()
        # the first child is the (theta0, h0) evaluation, with the inference server next to it
        assert first["metadata"]["name"] == "two-cycles-eval-c00-s000000-start-1"
        dep = wait_for(
            lambda: api.get("apps/v1", "deployments", kube_namespace, "two-cycles-vllm"), what="the vLLM Deployment"
        )
        owner = dep["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "WhaleRun" and owner["uid"] == run.wr()["metadata"]["uid"]
        assert api.get("v1", "services", kube_namespace, "two-cycles-vllm") is not None
        api.ready_deployment(kube_namespace, "two-cycles-vllm")
        wait_for(
            lambda: conditions(run.status()).get("InferenceReady", {}).get("status") == "True",
            what="InferenceReady=True",
        )
        final = run.play_to_end()
        # Events are posted after the status write: wait for the last one
        events_seen = wait_for(
            lambda: (ev := events(api, kube_namespace, "two-cycles")) and ("Normal", "Succeeded") in ev and ev,
            what="the Succeeded event",
        )

    assert final["phase"] == "Succeeded", final
    assert final["completedPhases"] == ["c01-weight", "c01-harness", "c02-weight"]
    assert final["step"] == 4 and final["checkpointStep"] == 4
    assert final["currentHarness"] == layout.harness_key("two-cycles", "c01-accepted")
    assert final["best"]["meanAtK"] == pytest.approx(0.14) and final["best"]["step"] == 4
    assert final["rolloutsSpent"] == 4 * 8 + 2 * 24
    # one Job per phase, each created exactly once, attempt 1
    assert run.job_names() == sorted(
        [
            "two-cycles-eval-c00-s000000-start-1",
            "two-cycles-c01-weight-1",
            "two-cycles-eval-c01-s000002-weight-1",
            "two-cycles-c01-harness-1",
            "two-cycles-eval-c01-s000002-harness-1",
            "two-cycles-c02-weight-1",
            "two-cycles-eval-c02-s000004-weight-1",
        ]
    )
    cond = conditions(final)
    assert cond["Succeeded"]["status"] == "True" and cond["Progressing"]["status"] == "False"
    assert cond["Failed"]["status"] == "False"
    assert all(c["observedGeneration"] == 1 for c in cond.values())
    assert ("Normal", "Started") in events_seen and ("Normal", "Succeeded") in events_seen
    assert ("Normal", "PhaseStarted") in events_seen and ("Normal", "NewBest") in events_seen
    # the finished run gives its GPUs back
    dep = api.get("apps/v1", "deployments", kube_namespace, "two-cycles-vllm")
    assert dep["spec"]["replicas"] == 0


def test_adaptive_run_stops_phases_by_patience(start_operator, make_run, store):
    """Flat training signals: the operator asks each phase to stop when the patience rule fires."""
    spec = {
        "condition": "adaptive_whale",
        "schedule": {
            "totalSteps": 8,
            "weightStepsPerCycle": None,
            "maxCycles": 2,
            "adaptive": {
                "weight": {"windowSteps": 1, "burnInSteps": 2, "patienceSteps": 1},
                "harness": {"minIterations": 2, "patience": 1, "maxIterations": 4},
            },
        },
    }
    with start_operator():
        run = make_run("adaptive", spec)
        stops: dict[str, str] = {}
        while True:
            st = run.status()
            if st.get("phase") in ("Succeeded", "Failed"):
                break
            job = run.pending_job()
            if job is None:
                continue
            req = run.request(job)
            if req.kind.value == "eval":
                run.finish(job)
                continue
            # a slow workload that relies on the controller's stop request: one step at a time
            stop = layout.stop_key("adaptive", req.phase)
            weight = isinstance(req, WeightRequest)
            limit = req.weight.target_step - req.weight.from_step if weight else req.harness.iterations
            done = 0
            for i in range(1, limit + 1):
                if weight:
                    run.weight_metrics(req, req.weight.from_step + i)
                    field, reached = "step", req.weight.from_step + i
                else:
                    run.harness_metrics(req, i)
                    field, reached = "iteration", i
                done = i
                # the status shows this step once the operator observed it, and a reconcile writes its stop
                # request before its status: wait for that event (not a fixed second a loaded machine can miss)
                wait_for(
                    lambda stop=stop, field=field, reached=reached: (
                        run.store.exists(stop) or run.status().get(field, 0) >= reached
                    ),
                    timeout_s=60,
                    what=f"the operator to observe {field} {reached}",
                )
                if run.store.exists(stop):
                    break
            stops[req.phase] = run.store.read_text(stop) if run.store.exists(stop) else ""
            if weight:
                run.finish_weight(req, req.weight.from_step + done, write_metrics=False, stopped_by="stop-request")
            else:
                run.finish_harness(req, done, write_metrics=False, stopped_by="stop-request")
            run.complete(job)
    final = run.status()
    assert final["phase"] == "Succeeded", final
    assert final["completedPhases"] == ["c01-weight", "c01-harness", "c02-weight", "c02-harness"]
    assert sorted(final["stopRequested"]) == sorted(final["completedPhases"])
    assert "patience fired after step 2" in stops["c01-weight"]
    assert "patience fired after iteration 2" in stops["c01-harness"]
    assert final["step"] == 4  # two weight phases of 2 steps each, out of a budget of 8


def test_failed_train_job_is_retried_then_fails_the_run(start_operator, make_run, kube_cluster, kube_namespace):
    api = kube_cluster.api
    with start_operator():
        run = make_run("flaky", {"retry": {"maxAttempts": 2}})
        run.finish(run.wait_job())  # the start evaluation
        for attempt in (1, 2):
            job = run.wait_job()
            assert job["metadata"]["name"] == f"flaky-c01-weight-{attempt}"
            # the kubelet's view of the failed worker: its last log line is the termination message
            pod = f"{job['metadata']['name']}-abcde"
            api.create(
                "v1",
                "pods",
                kube_namespace,
                {"metadata": {"name": pod, "labels": {"batch.kubernetes.io/job-name": job["metadata"]["name"]}}},
            )
            api.patch(
                "v1",
                "pods",
                kube_namespace,
                pod,
                {
                    "status": {
                        "containerStatuses": [
                            {
                                "name": "worker",
                                "state": {
                                    "terminated": {
                                        "exitCode": 1,
                                        "message": "Traceback ...\nRuntimeError: CUDA out of memory",
                                    }
                                },
                            }
                        ]
                    }
                },
                sub="status",
            )
            run.fail(job, "Container worker for pod failed with exit code 1 matching FailJob rule at index 1")
        final = wait_for(
            lambda: run.status() if run.status().get("phase") == "Failed" else None, what="the run to fail"
        )
        seen = wait_for(
            lambda: (ev := events(api, kube_namespace, "flaky")) and ("Warning", "Failed") in ev and ev,
            what="the Failed event",
        )
    assert final["reason"] == "PhaseFailed"
    assert final["failures"] == {"c01-weight": 2} and final["attempts"]["c01-weight"] == 2
    assert "RuntimeError: CUDA out of memory" in final["message"]
    cond = conditions(final)
    assert cond["Failed"]["status"] == "True" and cond["Failed"]["reason"] == "PhaseFailed"
    assert "c01-weight" in cond["Failed"]["message"]
    assert ("Warning", "PhaseRetried") in seen and ("Warning", "Failed") in seen
    assert "flaky-c01-weight-3" not in run.job_names()


def test_suspend_and_resume(start_operator, make_run, kube_cluster, kube_namespace):
    api = kube_cluster.api
    with start_operator():
        run = make_run("pause")
        run.finish(run.wait_job())
        running = run.wait_job()
        assert running["metadata"]["name"] == "pause-c01-weight-1"
        api.patch(WR, "whaleruns", kube_namespace, "pause", {"spec": {"suspend": True}})
        st = wait_for(
            lambda: run.status() if run.status().get("phase") == "Suspended" else None, what="phase Suspended"
        )
        assert conditions(st)["Suspended"]["status"] == "True"
        assert conditions(st)["Progressing"]["status"] == "False"
        wait_for(lambda: "pause-c01-weight-1" not in run.job_names(), what="the running Job to be deleted")
        wait_for(
            lambda: api.get("apps/v1", "deployments", kube_namespace, "pause-vllm")["spec"]["replicas"] == 0,
            what="inference scaled to zero",
        )
        run.handled.discard("pause-c01-weight-1")

        api.patch(WR, "whaleruns", kube_namespace, "pause", {"spec": {"suspend": False}})
        again = run.wait_job()
        assert again["metadata"]["name"] == "pause-c01-weight-1"  # same attempt: resumes from its state
        st = wait_for(lambda: run.status() if run.status().get("phase") == "Running" else None, what="Running")
        assert st["failures"] == {} and st["attempts"]["c01-weight"] == 1
        assert api.get("apps/v1", "deployments", kube_namespace, "pause-vllm")["spec"]["replicas"] == 1
        wait_for(lambda: ("Normal", "Suspended") in events(api, kube_namespace, "pause"), what="Suspended")
        final = run.play_to_end()
        wait_for(lambda: ("Normal", "Resumed") in events(api, kube_namespace, "pause"), what="the Resumed event")
    assert final["phase"] == "Succeeded"


@pytest.mark.slow
def test_operator_restart_in_every_stage(start_operator, make_run):
    """Stop the operator while each child runs and finish the child while it is down: the restarted
    operator creates no duplicate, loses no result and repeats no finished phase."""
    run = make_run("restart")  # Pending: created while no operator runs
    assert run.status() == {}
    stages = []
    while run.status().get("phase") != "Succeeded":
        with start_operator():
            job = run.pending_job() or wait_for(
                lambda: run.pending_job() or (run.status().get("phase") == "Succeeded" and "done"),
                what="the next Job or the end",
            )
            if job == "done":
                break
            stages.append(run.status().get("stage"))
        with start_operator():  # restarted while the child is still running: nothing new appears
            wait_for(lambda: run.status().get("observedGeneration") == 1, what="a reconcile")
            assert run.pending_job()["metadata"]["name"] == job["metadata"]["name"]
        run.finish(job)  # the child finishes while no operator runs
    final = run.status()
    assert final["phase"] == "Succeeded", final
    assert {"weight", "harness"} <= set(stages)
    assert final["completedPhases"] == ["c01-weight", "c01-harness", "c02-weight"]
    assert all(name.endswith("-1") for name in run.job_names()), run.job_names()
    assert len(run.job_names()) == 7 and final["attempts"] == {k: 1 for k in final["attempts"]}


def test_an_existing_run_secret_is_never_overwritten(start_operator, make_run, kube_cluster, kube_namespace):
    """The run's Secret is generated once: a later reconcile (or an operator restart) keeps the token the harness
    host and the running workloads already hold."""
    api = kube_cluster.api
    body = {"metadata": {"name": "keeper-auth"}, "type": "Opaque", "stringData": {"harness-token": "kept"}}
    api.create("v1", "secrets", kube_namespace, {"apiVersion": "v1", "kind": "Secret", **body})
    with start_operator():
        make_run("keeper", {"domain": "math_reasoning"}).wait_job()
        wait_for(lambda: api.get("apps/v1", "deployments", kube_namespace, "keeper-harness"), what="the harness host")
    secret = api.get("v1", "secrets", kube_namespace, "keeper-auth")
    # the API server keeps stringData as base64 data
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {"harness-token": "kept"}


def test_deleted_whalerun_takes_its_children(start_operator, make_run, kube_cluster, kube_namespace):
    api = kube_cluster.api
    with start_operator():
        run = make_run("doomed", {"domain": "math_reasoning"})
        run.wait_job()
        wait_for(lambda: api.get("apps/v1", "deployments", kube_namespace, "doomed-sandbox"), what="the sandbox")
        assert api.get("networking.k8s.io/v1", "networkpolicies", kube_namespace, "doomed-sandbox-isolation")
        # the harness host, its NetworkPolicy and the run's own Secret (before the host's pods that read it)
        wait_for(lambda: api.get("apps/v1", "deployments", kube_namespace, "doomed-harness"), what="the harness host")
        assert api.get("networking.k8s.io/v1", "networkpolicies", kube_namespace, "doomed-harness-isolation")
        secret = api.get("v1", "secrets", kube_namespace, "doomed-auth")
        assert len(secret.get("stringData", secret.get("data", {}))["harness-token"]) >= 32
        api.delete(WR, "whaleruns", kube_namespace, "doomed")
        wait_for(lambda: api.get(WR, "whaleruns", kube_namespace, "doomed") is None, what="the WhaleRun to go")
        for api_version, plural in (
            ("batch/v1", "jobs"),
            ("apps/v1", "deployments"),
            ("v1", "services"),
            ("networking.k8s.io/v1", "networkpolicies"),
            ("v1", "secrets"),
        ):
            assert api.list(api_version, plural, kube_namespace, f"{names.LABEL_RUN}=doomed") == [], plural


def test_bad_spec_is_marked_failed_naming_the_field(start_operator, make_run, kube_cluster, kube_namespace, store):
    api = kube_cluster.api
    with start_operator():
        run = make_run(
            "broken",
            raw_spec={
                "domain": "synthetic",
                "condition": "whale",
                "schedule": {"totalSteps": 4, "weightStepsPerCycle": 2},
                "storage": {"uri": store.uri},
                "harnessSearch": {"proposer": {"backend": "replay", "script": "p.json"}},
            },
        )
        st = wait_for(lambda: run.status() if run.status().get("phase") == "Failed" else None, what="Failed")
        assert st["reason"] == "InvalidSpec" and st["message"].startswith("spec.experiment.model")
        failed = conditions(st)["Failed"]
        assert (
            failed["status"] == "True"
            and failed["reason"] == "InvalidSpec"
            and "spec.experiment.model" in failed["message"]
        )
        wait_for(lambda: ("Warning", "InvalidSpec") in events(api, kube_namespace, "broken"), what="InvalidSpec")
        assert run.jobs() == []
        # fixing the spec (a new generation) starts the run from scratch
        api.patch(WR, "whaleruns", kube_namespace, "broken", {"spec": {"model": {"name": "Qwen/Qwen3.5-2B"}}})
        assert run.wait_job()["metadata"]["name"] == "broken-eval-c00-s000000-start-1"
        st = run.status()
        assert st["phase"] == "Running" and st["observedGeneration"] == 2


def test_serving_target_follows_the_running_child(start_operator, make_run, store, kube_cluster, kube_namespace):
    """An evaluation of a checkpoint is served that checkpoint; the next phase gets the current weights."""
    from whale.core.layout import serving_key

    with start_operator():
        run = make_run("serve")
        run.finish(run.wait_job())  # start eval: base model
        assert run.store.read_json(serving_key("serve")) == {"checkpoint": None}
        # the note an operator before this one wrote on the vLLM Deployment: gone at the next served checkpoint
        old_note = {"metadata": {"annotations": {names.ANNOTATION_CHECKPOINT: "base"}}}
        kube_cluster.api.patch("apps/v1", "deployments", kube_namespace, "serve-vllm", old_note)
        run.finish(run.wait_job())  # c01-weight -> checkpoint step 2
        ev = run.wait_job()
        assert ev["metadata"]["name"] == "serve-eval-c01-s000002-weight-1"
        ckpt = layout.checkpoint_prefix("serve", 2)
        assert run.store.read_json(serving_key("serve")) == {"checkpoint": ckpt}
        assert run.status()["currentCheckpoint"] == ckpt  # what is served, for whoever reads the run
        dep = kube_cluster.api.get("apps/v1", "deployments", kube_namespace, "serve-vllm")
        assert names.ANNOTATION_CHECKPOINT not in (dep["metadata"].get("annotations") or {}), "a stale note is removed"
        # made again (deleted by hand): the pods load the target from the store; the Deployment names none
        kube_cluster.api.delete("apps/v1", "deployments", kube_namespace, "serve-vllm")
        run.finish(ev)
        run.wait_job()  # the next phase (its start ensures the run's infrastructure again)
        dep = wait_for(
            lambda: kube_cluster.api.get("apps/v1", "deployments", kube_namespace, "serve-vllm"), what="the Deployment"
        )
        assert names.ANNOTATION_CHECKPOINT not in (dep["metadata"].get("annotations") or {})
        assert run.store.read_json(serving_key("serve")) == {"checkpoint": ckpt}
