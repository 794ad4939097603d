"""cluster.admission and gang scheduling, as built: a phase JobSet (its vLLM server and its workload, one Kueue
Workload) and a coscheduling PodGroup, each validated against the real CRD of its project (vendored under
tests/fixtures/crds/), their pod templates against the Kubernetes schemas and the restricted Pod Security Standard;
and how the operator reads a JobSet back (queued, admitted, evicted, finished)."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from tests.operator.pod_security import violations
from tests.operator.test_manifests import EXAMPLES, docs
from whale.core import layout
from whale.core.alternation import ChildState
from whale.core.layout import PhaseId
from whale.core.protocol import EvalPhaseArgs, PhaseRequest, WeightPhaseArgs, phase_request
from whale_operator import builders, kueue, names, observe
from whale_operator.cluster_spec import ClusterRunSpec

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"
RUN = builders.RunRef("demo", "team-a", "uid-1")
STORE = "s3://whale/runs"


@functools.cache
def crd_validator(file: str, version: str) -> jsonschema.Draft4Validator:
    """The openAPIV3Schema of one version of a vendored CRD (OpenAPI 3.0 bounds are draft 4's)."""
    crd = yaml.safe_load((CRDS / file).read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(schema)


@functools.cache
def jobset_spec_rules() -> list[tuple[str, Any]]:
    """The CEL rules JobSet's CRD puts on ``spec`` (the create-time ones: no ``oldSelf``), compiled."""
    crd = yaml.safe_load((CRDS / "jobset.x-k8s.io_jobsets.yaml").read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")["schema"]["openAPIV3Schema"]
    env = celpy.Environment()
    rules = schema["properties"]["spec"].get("x-kubernetes-validations", [])
    return [(r["message"], env.program(env.compile(r["rule"]))) for r in rules if "oldSelf" not in r["rule"]]


def validate_jobset(js: dict[str, Any]) -> None:
    """The JobSet against JobSet's CRD (schema and CEL rules), each replicated Job's template as a strict batch/v1
    Job, and the webhook's rule that the first replicated Job depends on nothing."""
    crd_validator("jobset.x-k8s.io_jobsets.yaml", "v1alpha2").validate(js)
    assert jobset_spec_rules(), "the vendored CRD has its spec rules"
    for message, program in jobset_spec_rules():
        assert program.evaluate({"self": celpy.json_to_cel(js["spec"])}), message
    assert "dependsOn" not in js["spec"]["replicatedJobs"][0]
    for rjob in js["spec"]["replicatedJobs"]:
        as_job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{js['metadata']['name']}-{rjob['name']}-0", **rjob["template"]["metadata"]},
            "spec": rjob["template"]["spec"],
        }
        kubernetes_validate.validate(as_job, latest_version(), strict=True)


def example_spec(**cluster: Any) -> ClusterRunSpec:
    spec = docs(next(p for p in EXAMPLES if p.stem == "math-whale"))[0]["spec"]
    spec = copy.deepcopy(spec)
    spec.setdefault("cluster", {}).update(cluster)
    spec["execution"].setdefault("inference", {})["backend"] = "vllm"
    return ClusterRunSpec.model_validate(spec)


def weight_request(spec: ClusterRunSpec, attempt: int = 1) -> PhaseRequest:
    args = WeightPhaseArgs(
        cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=2, steps_per_epoch=4, total_steps=2
    )
    return phase_request(spec.to_wire(), run=RUN.name, phase="c01-weight", attempt=attempt, args=args)


def eval_request(spec: ClusterRunSpec) -> PhaseRequest:
    args = EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None)
    return phase_request(spec.to_wire(), run=RUN.name, phase="eval-c00-s000000-start", attempt=1, args=args)


def replicated(js: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in js["spec"]["replicatedJobs"] if r["name"] == name)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}


# ----- which mode --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cluster, inference, expected",
    [
        ({"queueName": "gpu"}, {}, True),  # auto under a queue, separate server: one unit
        ({}, {}, False),  # auto without a queue: today's children
        ({"queueName": "gpu"}, {"placement": "colocated"}, False),  # colocated is one pod already
        ({"queueName": "gpu", "admission": "perChild"}, {}, False),  # clusters without JobSet
        ({"admission": "jobSet"}, {}, True),  # JobSet without Kueue: still the server first, one unit
        ({"queueName": "gpu"}, {"backend": "openai", "baseUrl": "http://x/v1"}, False),  # no server of ours
    ],
)
def test_admission_auto_resolves_to_a_jobset_under_a_queue_with_a_separate_server(cluster, inference, expected):
    spec = example_spec(**cluster)
    spec = spec.with_sections(**{"inference": spec.execution.inference.model_copy(update=_snake(inference))})
    assert builders.uses_jobset(spec) is expected


def _snake(d: dict[str, Any]) -> dict[str, Any]:
    return {{"baseUrl": "base_url"}.get(k, k): v for k, v in d.items()}


def test_jobset_needs_a_separately_placed_vllm_server():
    with pytest.raises(ValueError, match="cluster.admission: jobSet"):
        ClusterRunSpec.model_validate(
            {
                **example_spec().to_wire(),
                "cluster": {"admission": "jobSet"},
                "execution": {"inference": {"backend": "vllm", "placement": "colocated"}},
            }
        )


# ----- the phase JobSet --------------------------------------------------------------------------------------


def test_a_phase_under_a_queue_is_one_suspended_jobset_with_its_server_first():
    spec = example_spec(queueName="gpu")
    req = weight_request(spec)
    js = builders.phase_jobset(RUN, spec, req, store_uri=STORE)
    validate_jobset(js)
    name = js["metadata"]["name"]
    assert name == "demo-c01-weight-1" and len(name) <= names.MAX_JOBSET_NAME
    # Kueue admits the JobSet: suspended at creation, the queue label on it and nowhere below it
    assert js["spec"]["suspend"] is True
    assert js["metadata"]["labels"][names.LABEL_QUEUE] == "gpu"
    assert names.LABEL_QUEUE not in yaml.safe_dump(js["spec"])
    # decide() finds it like a Job: the phase and attempt labels, the request annotation
    assert observe.job_phase(js) == ("c01-weight", 1)
    assert js["metadata"]["annotations"][names.ANNOTATION_REQUEST] == layout.request_key("demo", "c01-weight")
    # the server first; the workload only once it is Ready; the workload alone decides success; no restarts
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["inference", "workload"]
    assert replicated(js, "workload")["dependsOn"] == [{"name": "inference", "status": "Ready"}]
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["workload"]}
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert "startupPolicy" not in js["spec"]  # deprecated by JobSet and exclusive with dependsOn
    # the server is the Deployment's pod (vLLM, weight-sync sidecar, weights fetched first), as a Job's pod
    # (the phase's own server rings no doorbell: JobSet starts the workload once it is Ready)
    deployment = builders.inference_deployment(RUN, spec, store_uri=STORE, doorbell=False)
    dep = deployment["spec"]["template"]["spec"]
    server = replicated(js, "inference")["template"]["spec"]["template"]["spec"]
    assert server == {**dep, "restartPolicy": "OnFailure"}
    assert [c["name"] for c in server["containers"]] == ["vllm", "weight-sync"]
    assert [c["name"] for c in server["initContainers"]] == ["fetch-weights"]
    server_job = replicated(js, "inference")["template"]["spec"]
    assert (server_job["completionMode"], server_job["completions"]) == ("Indexed", 1)  # pod <jobset>-inference-0-0
    # the workload is today's Job, reaching its own server by JobSet's pod DNS name
    job = builders.job(RUN, spec, req, store_uri=STORE)
    workload = replicated(js, "workload")["template"]["spec"]
    assert (
        workload["template"]["spec"]["containers"][0]["command"]
        == job["spec"]["template"]["spec"]["containers"][0]["command"]
    )
    url = env_of(workload["template"]["spec"])["WHALE_INFERENCE_URL"]
    assert url == "http://demo-c01-weight-1-inference-0-0.demo-c01-weight-1.team-a.svc:8000/v1"
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    assert "suspend" not in workload  # JobSet suspends its Jobs
    # the server pod keeps the labels the inference NetworkPolicy admits traffic to
    policy = builders.inference_network_policy(RUN)["spec"]["podSelector"]["matchLabels"]
    server_labels = replicated(js, "inference")["template"]["spec"]["template"]["metadata"]["labels"]
    assert policy.items() <= server_labels.items()
    # the Jobs JobSet creates are not the run's children (decide() sees the JobSet, not them)
    for rjob in js["spec"]["replicatedJobs"]:
        assert names.LABEL_RUN not in rjob["template"]["metadata"]["labels"]


def test_without_a_queue_the_jobset_is_created_running():
    spec = example_spec(admission="jobSet")
    js = builders.phase_jobset(RUN, spec, eval_request(spec), store_uri=STORE)
    validate_jobset(js)
    assert "suspend" not in js["spec"] and names.LABEL_QUEUE not in js["metadata"]["labels"]
    assert js["metadata"]["name"] == "demo-eval-c00-s000000-start-1"


def test_jobset_pods_pass_the_restricted_pod_security_standard():
    spec = example_spec(queueName="gpu")
    search = spec.experiment.harness_search
    spec = spec.with_sections(  # at isolation none a cli agent has the host's network, said by name
        sandbox=spec.execution.sandbox.model_copy(update={"isolation": "none", "acknowledge_unisolated": True}),
        harness_search=search.model_copy(update={"proposer": search.proposer.model_copy(update={"network": "host"})}),
    )
    js = builders.phase_jobset(RUN, spec, eval_request(spec), store_uri=STORE)
    for rjob in js["spec"]["replicatedJobs"]:
        assert violations({"kind": "Job", "spec": rjob["template"]["spec"]}) == [], rjob["name"]


def test_a_long_run_name_still_names_a_jobset_jobset_accepts():
    run = builders.RunRef("r" * 45, "ns", "uid")
    spec = example_spec(queueName="gpu")
    args = EvalPhaseArgs(cycle=99, step=999999, after="harness", checkpoint=None, harness=None, iteration=7)
    phase = PhaseId.eval(99, 999999, "harness", 7).key
    req = phase_request(spec.to_wire(), run=run.name, phase=phase, attempt=100, args=args)
    name = names.jobset_name(run.name, req.phase, req.attempt)
    assert len(name) <= names.MAX_JOBSET_NAME and name[0].isalpha() and name[-1].isalnum()
    longest_pod = f"{name}-workload-0-1023-abcde"  # JobSet's webhook check (Indexed Job, 1024 nodes)
    assert len(longest_pod) <= 63
    assert name != names.jobset_name(run.name, req.phase, req.attempt + 1)
    js = builders.phase_jobset(run, spec, req, store_uri=STORE)
    validate_jobset(js)


# ----- gang scheduling ---------------------------------------------------------------------------------------


def multi_node(spec: ClusterRunSpec, nodes: int = 4) -> ClusterRunSpec:
    return spec.with_sections(**{"train": spec.execution.train.model_copy(update={"num_nodes": nodes})})


def test_a_multi_node_train_job_gets_a_pod_group_of_all_its_pods():
    spec = multi_node(example_spec(gangScheduling="podGroup", schedulerName="scheduler-plugins-scheduler"))
    req = weight_request(spec)
    job = builders.job(RUN, spec, req, store_uri=STORE)
    group = builders.pod_group(RUN, spec, req, job["metadata"]["name"])
    assert group is not None
    crd_validator("scheduling.x-k8s.io_podgroups.yaml", "v1alpha1").validate(group)
    assert group["metadata"]["name"] == job["metadata"]["name"] and group["spec"] == {"minMember": 4}
    assert group["metadata"]["ownerReferences"][0]["kind"] == "WhaleRun"
    job = builders.in_pod_group(job, group["metadata"]["name"])
    kubernetes_validate.validate(job, latest_version(), strict=True)
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"][builders.POD_GROUP_LABEL] == "demo-c01-weight-1"
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == group["spec"]["minMember"]


@pytest.mark.parametrize(
    "nodes, gang, kind", [(1, "podGroup", "weight"), (4, "none", "weight"), (4, "podGroup", "eval")]
)
def test_no_pod_group_where_nothing_spans_nodes(nodes, gang, kind):
    spec = multi_node(example_spec(gangScheduling=gang), nodes)
    req = weight_request(spec) if kind == "weight" else eval_request(spec)
    assert builders.gang_size(spec, req) == 0 and builders.pod_group(RUN, spec, req, "x") is None


def test_in_jobset_mode_the_gang_is_the_workload_and_its_rendezvous_is_jobset_dns():
    spec = multi_node(example_spec(queueName="gpu", gangScheduling="podGroup"), 2)
    req = weight_request(spec)
    js = builders.phase_jobset(RUN, spec, req, store_uri=STORE)
    group = builders.pod_group(RUN, spec, req, js["metadata"]["name"])
    assert group is not None and group["spec"]["minMember"] == 2
    js = builders.in_pod_group(js, group["metadata"]["name"])
    validate_jobset(js)
    workload = replicated(js, "workload")["template"]["spec"]
    assert workload["completionMode"] == "Indexed" and workload["parallelism"] == 2
    assert workload["template"]["metadata"]["labels"][builders.POD_GROUP_LABEL] == js["metadata"]["name"]
    server = replicated(js, "inference")["template"]["spec"]["template"]
    assert builders.POD_GROUP_LABEL not in server["metadata"]["labels"]  # started first, alone
    pod = workload["template"]["spec"]
    assert env_of(pod)["MASTER_ADDR"] == "demo-c01-weight-1-workload-0-0.demo-c01-weight-1.team-a.svc"
    assert "subdomain" not in pod  # JobSet sets it to its headless Service


def test_scheduler_name_reaches_every_pod_of_the_run():
    spec = example_spec(schedulerName="my-scheduler")
    req = weight_request(spec)
    tools = ()
    pods = [
        builders.job(RUN, spec, req, store_uri=STORE, tools=tools)["spec"]["template"]["spec"],
        builders.prepare_job(RUN, spec, 1, store_uri=STORE)["spec"]["template"]["spec"],
        builders.inference_deployment(RUN, spec, store_uri=STORE)["spec"]["template"]["spec"],
    ]
    js = builders.phase_jobset(RUN, spec, req, store_uri=STORE)
    pods += [r["template"]["spec"]["template"]["spec"] for r in js["spec"]["replicatedJobs"]]
    assert all(p["schedulerName"] == "my-scheduler" for p in pods)
    assert "schedulerName" not in builders.job(RUN, example_spec(), req, store_uri=STORE)["spec"]["template"]["spec"]


# ----- reading a JobSet back ---------------------------------------------------------------------------------


def jobset(*, suspend: bool, annotations=None, conditions=(), active: int = 0) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    }
    if active:
        status["replicatedJobsStatus"] = [
            {"name": "inference", "ready": 1, "active": 1, "succeeded": 0, "failed": 0, "suspended": 0},
            {"name": "workload", "ready": 0, "active": active - 1, "succeeded": 0, "failed": 0, "suspended": 0},
        ]
    return {
        "metadata": {"name": "js", "annotations": dict(annotations or {})},
        "spec": {"suspend": suspend, "replicatedJobs": []},
        "status": status,
    }


MARK = {kueue.STARTED_ANNOTATION: "2026-12-03T09:00:05Z"}


def test_a_queued_jobset_waits_and_an_admitted_one_is_marked():
    queued = jobset(suspend=True, conditions=[("Suspended", "True", "SuspendedJobs", "jobset is suspended")])
    assert observe.job_child(queued).state is ChildState.RUNNING and "queued" in observe.job_child(queued).message
    assert not kueue.needs_started_mark(queued)
    admitted = jobset(suspend=False, active=2, conditions=[("Suspended", "False", "ResumeJobs", "")])
    assert kueue.needs_started_mark(admitted) and observe.job_child(admitted).state is ChildState.RUNNING
    assert observe.child_kind(admitted) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert observe.child_kind({"spec": {"template": {}}}) == ("batch/v1", "Job")


def test_an_evicted_jobset_is_kept_and_its_eviction_counted_not_failed():
    evicted = jobset(
        suspend=True,
        annotations=MARK,
        conditions=[("Suspended", "True", "SuspendedJobs", "jobset is suspended")],  # the JobSet controller's words
    )
    assert kueue.evicted(evicted) == "jobset is suspended"
    child = observe.job_child(evicted)
    # kept for Kueue to re-admit (JobSet resumes its Jobs): nothing for decide() to start, one eviction counted
    assert child.state is ChildState.RUNNING and child.evictions == 1


def test_a_finished_jobset_succeeds_or_fails():
    done = jobset(suspend=False, annotations=MARK, conditions=[("Completed", "True", "AllJobsCompleted", "")])
    assert observe.job_child(done).state is ChildState.SUCCEEDED
    failed = jobset(
        suspend=False,
        annotations=MARK,
        conditions=[("Failed", "True", "FailedJobs", "jobset failed due to job demo-c01-weight-1-workload-0")],
    )
    child = observe.job_child(failed)
    assert child.state is ChildState.FAILED and "workload-0" in child.message
    # with the failed worker's last words, found among the JobSet's pods
    assert observe.pod_selector(failed) == "jobset.sigs.k8s.io/jobset-name=js"
    worded = observe.job_child(failed, "Traceback ...\nRuntimeError: CUDA out of memory")
    assert worded.message.endswith("; RuntimeError: CUDA out of memory")


def test_the_custom_kinds_a_spec_needs_are_named_with_their_field():
    assert builders.required_apis(example_spec()) == []
    assert builders.required_apis(example_spec(queueName="gpu")) == [
        ("spec.cluster.admission", "jobset.x-k8s.io/v1alpha2", "JobSet >= 0.8 (kubernetes-sigs/jobset)")
    ]
    gang = multi_node(example_spec(gangScheduling="podGroup"), 2)
    assert [field for field, _, _ in builders.required_apis(gang)] == ["spec.cluster.gangScheduling"]
    assert builders.required_apis(example_spec(gangScheduling="podGroup")) == []  # one node: no group


@pytest.mark.parametrize("overlay", ["cluster", "namespaced"])
def test_the_operator_may_manage_jobsets_and_create_pod_groups(overlay):
    """What the operator does to them (tests/operator/test_packaging.py keeps the chart equal to the overlays):
    JobSets created, listed, watched, patched (the started mark), deleted (a superseded attempt); PodGroups created;
    Jobs patched too (the started mark)."""
    from tests.operator.test_packaging import bound_to_operator

    held = bound_to_operator(overlay)
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert ("jobset.x-k8s.io", "jobsets", verb) in held, verb
    assert ("scheduling.x-k8s.io", "podgroups", "create") in held
    assert ("batch", "jobs", "patch") in held


@pytest.mark.parametrize("overlay", ["cluster", "namespaced"])
def test_the_operator_may_list_kueue_workloads_and_nothing_more(overlay):
    """The eviction's reason is on Kueue's Workload: the operator lists them (by the owner's UID label) and never
    writes one (it leaves requeueing and deactivation to Kueue and the admins)."""
    from tests.operator.test_packaging import bound_to_operator

    held = {
        verb
        for group, resource, verb in bound_to_operator(overlay)
        if (group, resource) == ("kueue.x-k8s.io", "workloads")
    }
    assert held == {"list"}


def test_inference_is_ready_when_a_running_phase_jobset_has_its_server_ready():
    admitted = jobset(suspend=False, active=2, annotations=MARK)
    assert observe.inference_ready(None, [admitted])
    queued = jobset(suspend=True)
    assert not observe.inference_ready(None, [queued])
    done = jobset(suspend=False, active=2, annotations=MARK, conditions=[("Completed", "True", "AllJobsCompleted", "")])
    assert not observe.inference_ready(None, [done])  # JobSet stops the server of a finished unit
    assert not observe.inference_ready(None, [{"metadata": {"name": "j"}, "spec": {"template": {}}, "status": {}}])


def test_the_operators_client_knows_the_new_kinds():
    """kube.PLURALS maps every kind the operator creates to its REST path (a kind missing there is a KeyError at
    the first create on a cluster)."""
    from whale_operator.kube import PLURALS

    spec = multi_node(example_spec(queueName="gpu", gangScheduling="podGroup"), 2)
    req = weight_request(spec)
    js = builders.phase_jobset(RUN, spec, req, store_uri=STORE)
    group = builders.pod_group(RUN, spec, req, js["metadata"]["name"])
    assert group is not None
    for manifest in (js, group):
        assert PLURALS[(manifest["apiVersion"], manifest["kind"])] in ("jobsets", "podgroups")


def test_the_documented_wait_for_pods_ready_timeout_covers_the_vllm_startup_budget():
    """docs/operator.md names the Kueue ``waitForPodsReady`` timeout to set; it must outlast the server's startupProbe
    (a phase JobSet's workload starts only after the server is Ready), or Kueue evicts the unit before it answers."""
    text = (Path(__file__).resolve().parents[2] / "docs/operator.md").read_text()
    budget_s = builders.VLLM_STARTUP_PERIOD_S * builders.VLLM_STARTUP_FAILURES
    assert (
        f"`periodSeconds: {builders.VLLM_STARTUP_PERIOD_S}` × `failureThreshold: {builders.VLLM_STARTUP_FAILURES}`"
        in text
    )
    assert f"allows {budget_s // 60} minutes" in text
    (minutes,) = re.findall(r"waitForPodsReady: \{enable: true, timeout: (\d+)m\}", text)
    assert int(minutes) * 60 > budget_s
