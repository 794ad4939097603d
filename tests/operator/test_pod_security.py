"""Where the admin allows privileged sandbox hosts, every pod a WhaleRun gets is restricted-compliant but for one
listed exception (with the operator's defaults there is none: tests/operator/test_least_privilege.py); every child
validates for Kubernetes 1.29-1.37; per-component pod templates land where they should (and GPU tolerations do not
land on CPU pods); the lifecycle defaults; the vLLM NetworkPolicy builder.

THE EXCEPTION (docs/operator.md#pod-security, docs/security.md#on-a-cluster), rendered only for a run in a namespace
the admin lists (``WHALE_SANDBOX_HOST_NAMESPACES``, whale_operator.sandboxing; elsewhere ``namespaces`` runs at
``pod``): containers that start ``whale.sandbox`` sandboxes with kernel namespaces run as root with exactly
:data:`builders.SANDBOX_HOST_CAPABILITIES` and AppArmor unconfined, so that the launcher can build each sandbox's
namespaces; the untrusted program inside has no capability. Harness files and the proposer's ``run_shell`` commands
run in the run's harness pod (not in the workload Jobs), so those containers are:

* ``spec.execution.sandbox.isolation: namespaces``: the harness host's container, the ``sandbox`` code tool's container and,
  with a ``cli`` proposer only, the ``proposer-agent`` container of the harness-search Job (the agent's sandbox; it
  holds only the agent's key, the search's ``worker`` beside it is restricted: tests/operator/test_least_privilege.py);
* ``pod``: none: every pod of a run is restricted (the harness pod and the code tool are the walls; the ``cli``
  backend is refused);
* ``none``: none (the code tool's pod is its wall, as at ``pod``). Nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from tests.fixtures.specs import flat
from tests.operator.pod_security import pod_spec, violations
from tests.operator.test_manifests import EXAMPLES, children_of, docs, with_built_in_proposer
from tests.operator.test_packaging import K8S_VERSIONS
from whale import plugins
from whale.core.protocol import WeightPhaseArgs, phase_request
from whale_operator import builders
from whale_operator.cluster_spec import ClusterRunSpec

RUN = builders.RunRef("demo", "team-a", "uid-1")
STORE = "s3://whale"
#: (kind of object, component label, container) allowed to be the sandbox host, per spec.execution.sandbox.isolation
EXCEPTIONS = {
    "namespaces": {
        ("Deployment", "harness", "harness"),
        ("Deployment", "sandbox", "sandbox"),
    },
    "pod": set(),
    "none": set(),
}


def spec_of(path: Path, **cluster: Any) -> ClusterRunSpec:
    """The example with a built-in proposer (a ``cli`` one needs the admin's opt-in: tests/operator/test_least_privilege.py)."""
    wire = with_built_in_proposer(flat(docs(path)[0]["spec"]))
    if cluster:
        wire = {**wire, **cluster}
    return ClusterRunSpec.model_validate(wire)


def with_isolation(spec: ClusterRunSpec, isolation: str) -> ClusterRunSpec:
    return spec.with_sections(
        **{
            "sandbox": spec.execution.sandbox.model_copy(
                update={"isolation": isolation, "acknowledge_unisolated": isolation == "none"}
            )
        }
    )


def everything(spec: ClusterRunSpec) -> list[dict[str, Any]]:
    return [*children_of(spec), builders.inference_network_policy(RUN)]  # the harness host's too (children_of)


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"].get("app.kubernetes.io/component", "")


@pytest.mark.parametrize("isolation", ["namespaces", "pod", "none"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_pod_is_restricted_but_the_listed_sandbox_hosts(path: Path, isolation: str):
    spec = with_isolation(spec_of(path), isolation)
    hosts_seen = set()
    for obj in everything(spec):
        pod = pod_spec(obj)
        if pod is None:
            continue
        hosts = {
            c["name"] for c in pod["containers"] if c.get("securityContext", {}).get("capabilities", {}).get("add")
        }
        for name in hosts:
            where = (obj["kind"], component(obj), name)
            assert where in EXCEPTIONS[isolation], f"{where} is not a listed sandbox host at {isolation}"
            ctx = next(c for c in pod["containers"] if c["name"] == name)["securityContext"]
            assert set(ctx["capabilities"]["add"]) == set(builders.SANDBOX_HOST_CAPABILITIES)
            assert ctx["capabilities"]["drop"] == ["ALL"] and not ctx.get("privileged")
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
            hosts_seen.add(where)
        others = {**obj, "spec": {**obj["spec"]}}
        if hosts:  # check the rest of the pod as restricted: drop the excepted containers, keep the pod's fields
            stripped = {**pod, "containers": [c for c in pod["containers"] if c["name"] not in hosts]}
            if not stripped["containers"] and not stripped.get("initContainers"):
                continue
            others = {"kind": "Pod", "spec": stripped}
        assert violations(others) == [], (obj["kind"], obj["metadata"]["name"])
    if isolation == "namespaces":
        assert ("Deployment", "harness", "harness") in hosts_seen  # a built-in proposer: the search Job is restricted
    if isolation == "pod":
        assert hosts_seen == set()  # not even the harness search: run_shell runs on the harness host


#: one run of each domain and the CPU one (the others differ in numbers, not in shape)
SHAPES = [p for p in EXAMPLES if p.stem in ("chess-whale", "math-whale", "searchqa-whale", "tiny-cpu")]


@pytest.mark.parametrize("isolation", ["namespaces", "pod"])
@pytest.mark.parametrize("path", SHAPES, ids=lambda p: p.stem)
def test_every_child_validates_for_every_supported_kubernetes(path: Path, isolation: str):
    spec = spec_of(path, cluster={"placement": FULL_PLACEMENT, "lifecycle": {"ttlSecondsAfterFinished": 600}})
    for obj in everything(with_isolation(spec, isolation)):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


# ----- per-component pod templates ------------------------------------------------------------------

AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["h200"]}
                    ]
                }
            ]
        }
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 50,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"whale.dev/run": "demo"}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    },
}
SPREAD = [
    {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "search"}},
    }
]
FULL_PLACEMENT = {
    "harness": {"runtimeClassName": "gvisor", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "8Gi"}}},
    "train": {
        "affinity": AFFINITY,
        "runtimeClassName": "nvidia",
        "annotations": {"example.com/team": "a"},
        "labels": {"team": "a", "whale.dev/run": "not-mine"},
        "imagePullSecrets": [{"name": "pull"}],
    },
    "inference": {"nodeSelector": {"pool": "serve"}, "priorityClassName": "serving"},
    "workers": {
        "topologySpreadConstraints": SPREAD,
        "runtimeClassName": "gvisor",
        "resources": {"requests": {"cpu": "3", "memory": "6Gi"}, "limits": {"memory": "6Gi"}},
        "podSecurity": {"runAsUser": 2000},
    },
    "tools": {"tolerations": [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}]},
}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}


def placed(**placement: Any) -> ClusterRunSpec:
    return ClusterRunSpec.model_validate(
        {
            "domain": "math_reasoning",
            "condition": "whale",
            "model": {"name": "Qwen/Qwen3.5-2B"},
            "schedule": {"totalEpochs": 6, "weightEpochsPerCycle": 0.6},
            "storage": {"uri": STORE, "endpoint": "minio:9000"},
            "harnessSearch": {"proposer": {"baseUrl": "http://127.0.0.1:1/v1", "model": "m"}},
            "cluster": {
                "nodeSelector": {"pool": "ml"},
                "priorityClassName": "research",
                "tolerations": [GPU_TOLERATION, SPOT_TOLERATION],
                "placement": placement,
            },
        }
    )


def pods_by_component(spec: ClusterRunSpec) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in children_of(spec):
        pod = pod_spec(obj)
        if pod is not None:
            meta = obj["spec"]["template"]["metadata"]
            out.setdefault(component(obj), []).append({"meta": meta, "pod": pod, "obj": obj})
    return out


def test_gpu_tolerations_reach_only_pods_that_request_a_gpu():
    pods = pods_by_component(placed())
    for comp in ("train", "inference"):
        for p in pods[comp]:
            assert GPU_TOLERATION in p["pod"]["tolerations"], comp
    for comp in ("search", "eval", "prepare", "code", "sandbox"):
        for p in pods.get(comp, []):
            assert GPU_TOLERATION not in p["pod"].get("tolerations", []), comp
            assert SPOT_TOLERATION in p["pod"]["tolerations"], f"{comp}: the other run-wide tolerations stay"
    assert pods["search"] and pods["eval"] and pods["prepare"]


def test_a_cpu_train_job_gets_no_gpu_toleration():
    spec = placed()
    spec = spec.with_sections(**{"train": spec.execution.train.model_copy(update={"gpus_per_node": 0})})
    req = phase_request(
        spec,
        run="demo",
        phase="c01-weight",
        attempt=1,
        args=WeightPhaseArgs(
            cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=2, steps_per_epoch=4, total_steps=2
        ),
    )
    pod = builders.job(RUN, spec, req, store_uri=STORE)["spec"]["template"]["spec"]
    assert pod["tolerations"] == [SPOT_TOLERATION]


def test_each_component_takes_its_own_template():
    pods = pods_by_component(placed(**FULL_PLACEMENT))
    (train,) = [p for p in pods["train"] if "subdomain" not in p["pod"]]
    assert train["pod"]["affinity"] == AFFINITY and train["pod"]["runtimeClassName"] == "nvidia"
    assert train["pod"]["imagePullSecrets"] == [{"name": "pull"}]
    assert train["meta"]["annotations"] == {"example.com/team": "a"}
    assert train["meta"]["labels"]["team"] == "a"
    assert train["meta"]["labels"]["whale.dev/run"] == "example", "the operator's labels win a clash"
    assert train["pod"]["nodeSelector"] == {"pool": "ml"} and train["pod"]["priorityClassName"] == "research"

    (vllm,) = pods["inference"]
    assert vllm["pod"]["nodeSelector"] == {"pool": "serve"}, "maps merge, the component's key wins"
    assert vllm["pod"]["priorityClassName"] == "serving"
    assert "affinity" not in vllm["pod"] and "runtimeClassName" not in vllm["pod"]

    for comp in ("search", "eval", "prepare"):
        for p in pods[comp]:
            assert p["pod"]["topologySpreadConstraints"] == SPREAD and p["pod"]["runtimeClassName"] == "gvisor"
            (c,) = p["pod"]["containers"]
            assert c["resources"] == {"requests": {"cpu": "3", "memory": "6Gi"}, "limits": {"memory": "6Gi"}}
            assert "annotations" not in p["meta"]
    (prepare,) = pods["prepare"]
    assert prepare["pod"]["securityContext"]["runAsUser"] == 2000

    (harness,) = pods["harness"]  # its own template: gVisor, its resources, no run-wide GPU toleration
    assert harness["pod"]["runtimeClassName"] == "gvisor"
    assert all("gpu" not in t["key"] for t in harness["pod"].get("tolerations", []))
    assert harness["pod"]["containers"][0]["resources"] == {"requests": {"cpu": "1"}, "limits": {"memory": "8Gi"}}

    for p in pods.get("code", []) + pods.get("sandbox", []):
        assert p["pod"]["tolerations"] == [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}], (
            "a component's tolerations replace the run-wide ones"
        )


@pytest.mark.parametrize(
    "bad",
    [
        {"workers": {"podSecurity": {"runAsUser": 0}}},
        {
            "train": {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101, "preference": {}}]
                    }
                }
            }
        },
        {"tools": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]}},
        {"inference": {"runtimeClassName": "Not A Name"}},
        {"gpu": {}},
    ],
    ids=["root-uid", "weight-101", "when-unsatisfiable", "runtime-class", "unknown-component"],
)
def test_bad_templates_are_refused_by_the_spec(bad):
    with pytest.raises(ValidationError):
        placed(**bad)


# ----- lifecycle ------------------------------------------------------------------------------------


def test_jobs_have_a_deadline_and_a_ttl_by_default():
    spec = placed()
    for p in pods_by_component(spec)["search"] + pods_by_component(spec)["prepare"]:
        job = p["obj"]["spec"]
        assert job["activeDeadlineSeconds"] == 7 * 24 * 3600 and job["ttlSecondsAfterFinished"] == 7 * 24 * 3600
    spec = ClusterRunSpec.model_validate(
        {
            **flat(spec.to_wire()),
            "retry": {"activeDeadlineSeconds": 3600},
            "cluster": {"lifecycle": {"ttlSecondsAfterFinished": None}},
        }
    )
    for p in pods_by_component(spec)["search"]:
        assert p["obj"]["spec"]["activeDeadlineSeconds"] == 3600 and "ttlSecondsAfterFinished" not in p["obj"]["spec"]


def test_dev_shm_is_sized_to_the_memory_limit_and_the_model_cache_can_be_a_claim():
    spec = ClusterRunSpec.model_validate(
        {
            **flat(placed().to_wire()),
            "train": {"resources": {"limits": {"memory": "64Gi"}}},
            "cluster": {"inferenceResources": {"limits": {"memory": "120Gi"}}, "modelCacheClaimName": "models"},
        }
    )
    pods = pods_by_component(spec)
    for p in pods["train"]:
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in p["pod"]["volumes"]
    (vllm,) = pods["inference"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "120Gi"}} in vllm["pod"]["volumes"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "models"}} in vllm["pod"]["volumes"]
    for p in pods["search"]:  # no memory in the spec: the default size, never unbounded
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": builders.DEFAULT_SHM_SIZE}} in p["pod"][
            "volumes"
        ]


def test_the_servers_compile_caches_live_on_the_model_claim_which_no_untrusted_pod_mounts():
    """vLLM's compile cache and Triton's autotuned kernels go to the model volume, so a server started again on a
    model-cache claim (a phase's scale-up, a colocated weight phase) reuses them. Triton loads what it finds there
    as kernels: no pod but the servers' (and their trusted weight helpers) may mount the claim."""
    from tests.operator.test_builders import RUN, STORE, make_spec, tools_of, weight_request

    cache_env = {
        "VLLM_CACHE_ROOT": "/models/cache/vllm",
        "TRITON_CACHE_DIR": "/models/cache/triton",
        "TRITON_CACHE_AUTOTUNING": "1",
        "FLASHINFER_WORKSPACE_BASE": "/models/cache/flashinfer",
    }
    claim = {"name": "models", "persistentVolumeClaim": {"claimName": "models"}}
    spec = ClusterRunSpec.model_validate({**flat(placed().to_wire()), "cluster": {"modelCacheClaimName": "models"}})
    mounting = set()
    for comp, pods in pods_by_component(spec).items():
        for p in pods:
            if claim in p["pod"].get("volumes", []):
                mounting.add(comp)
    assert mounting == {"inference"}, "only the vLLM Deployment's pod mounts the claim"
    (server,) = pods_by_component(spec)["inference"]
    vllm = next(c for c in server["pod"]["containers"] if c["name"] == "vllm")
    assert cache_env.items() <= {e["name"]: e.get("value") for e in vllm["env"]}.items()
    assert {"name": "models", "mountPath": "/models"} in vllm["volumeMounts"]

    colocated = make_spec(
        train={"gpusPerNode": 4},
        inference={"backend": "vllm", "placement": "colocated"},
        cluster={"modelCacheClaimName": "models"},
    )
    job = builders.colocated_train_job(
        RUN, colocated, weight_request(colocated), store_uri=STORE, tools=tools_of("math_reasoning")
    )
    pod = job["spec"]["template"]["spec"]
    assert claim in pod["volumes"], "the colocated server starts every weight phase: it keeps its caches too"
    _fetch, colocated_vllm = pod["initContainers"]
    assert cache_env.items() <= {e["name"]: e.get("value") for e in colocated_vllm["env"]}.items()
    (trainer,) = pod["containers"]  # the trainer runs the candidate harnesses' sandboxes: never the claim
    assert all(m["name"] != "models" for m in trainer["volumeMounts"])
    without = make_spec(train={"gpusPerNode": 4}, inference={"backend": "vllm", "placement": "colocated"})
    plain = builders.colocated_train_job(
        RUN, without, weight_request(without), store_uri=STORE, tools=tools_of("math_reasoning")
    )
    assert {"name": "models", "emptyDir": {"sizeLimit": "100Gi"}} in plain["spec"]["template"]["spec"]["volumes"]


# ----- vLLM reachable only from the run's own pods --------------------------------------------------


def test_inference_network_policy_admits_only_the_runs_pods():
    spec = placed()
    policy = builders.inference_network_policy(builders.RunRef("example", "whale", "uid"))  # children_of's run
    kubernetes_validate.validate(policy, K8S_VERSIONS[-1], strict=True)
    (vllm,) = pods_by_component(spec)["inference"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= vllm["meta"]["labels"].items(), "it selects the vLLM pods"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": builders.VLLM_PORT}]
    (peer,) = rule["from"]
    assert peer == {"podSelector": {"matchLabels": {"whale.dev/run": "example"}}}, (
        "no namespaceSelector: this namespace only"
    )
    for p in pods_by_component(spec)["search"] + pods_by_component(spec)["train"]:
        assert peer["podSelector"]["matchLabels"].items() <= p["meta"]["labels"].items(), "the run's workers may call"
    other = builders.inference_network_policy(builders.RunRef("other", "team-a", "u2"))
    assert other["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {"whale.dev/run": "other"}


def test_the_examples_exercise_the_code_sandbox_exception():
    """The sandbox tool (the exception's second member) is among the children checked above."""
    assert any(t.sandboxed for p in EXAMPLES for t in plugins.load(spec_of(p).domain).tool_services)
