"""Pure builders, compared as whole manifest dicts (no API, no cluster)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from whale import plugins
from whale.core.convert import convert_v1alpha1
from whale.core.protocol import (
    EvalPhaseArgs,
    HarnessPhaseArgs,
    PhaseRequest,
    WeightPhaseArgs,
    phase_request,
)
from whale.domain import env_items_key
from whale_operator import builders, names
from whale_operator.cluster_spec import ClusterRunSpec

RUN = builders.RunRef("demo", "team-a", "uid-1")
OWNER = [
    convert_v1alpha1(
        {
            "apiVersion": "whale.dev/v1alpha1",
            "kind": "WhaleRun",
            "name": "demo",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    )
]
STORE = "s3://whale"


def make_spec(**over) -> ClusterRunSpec:
    doc: dict[str, Any] = {
        "domain": "math_reasoning",
        "condition": "whale",
        "model": {"name": "Qwen/Qwen3.5-2B"},
        "schedule": {"totalEpochs": 6, "weightEpochsPerCycle": 0.6},
        "storage": {"uri": STORE, "endpoint": "minio.whale.svc:9000", "credentialsSecret": "whale-s3"},
        "cluster": {
            "queueName": "gpu-queue",
            "priorityClassName": "research",
            "nodeSelector": {"gpu": "h200"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "harnessSearch": {
            "proposer": {"apiKeySecret": {"name": "proposer", "key": "api-key", "env": "ANTHROPIC_API_KEY"}}
        },
        "retry": {"activeDeadlineSeconds": 86400},
    }
    for k, v in over.items():
        doc[k] = {**doc.get(k, {}), **v} if isinstance(v, dict) else v
    return ClusterRunSpec.model_validate(doc)


def weight_request(spec: ClusterRunSpec, attempt: int = 1) -> PhaseRequest:
    return phase_request(
        spec.to_wire(),
        run="demo",
        phase="c01-weight",
        attempt=attempt,
        args=WeightPhaseArgs(
            cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=42, steps_per_epoch=70, total_steps=42
        ),
    )


PLACEMENT = {
    "priorityClassName": "research",
    "nodeSelector": {"gpu": "h200"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
#: a pod that requests no GPU: the run-wide GPU toleration stays away
CPU_PLACEMENT = {k: v for k, v in PLACEMENT.items() if k != "tolerations"}
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
SEVEN_DAYS = 7 * 24 * 3600


def tools_of(domain: str):
    return plugins.load(domain).tool_services


STORAGE_ENV = [
    {"name": "WHALE_S3_ENDPOINT", "value": "minio.whale.svc:9000"},
    {"name": "WHALE_S3_SECURE", "value": "false"},
]


def test_train_job_whole_manifest():
    spec = make_spec(train={"gpusPerNode": 1, "resources": {"requests": {"cpu": "8", "memory": "64Gi"}}})
    labels = {
        "app.kubernetes.io/name": "whale",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/managed-by": "whale-operator",
        "whale.dev/run": "demo",
        "app.kubernetes.io/component": "train",
        "whale.dev/cycle": "1",
        "whale.dev/phase": "c01-weight",
        "whale.dev/attempt": "1",
        "whale.dev/kind": "weight",
        "kueue.x-k8s.io/queue-name": "gpu-queue",
    }
    assert builders.job(RUN, spec, weight_request(spec), store_uri=STORE, tools=tools_of("math_reasoning")) == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "demo-c01-weight-1",
            "namespace": "team-a",
            "labels": labels,
            "ownerReferences": OWNER,
            "annotations": {"whale.dev/request": "runs/demo/phases/c01-weight/request.json"},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 86400,
            "ttlSecondsAfterFinished": SEVEN_DAYS,
            "suspend": True,  # queued: Kueue admits it by unsuspending
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [0]},
                    },
                ]
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    **PLACEMENT,
                    "automountServiceAccountToken": False,  # no workload calls the Kubernetes API
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "fsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "worker",
                            "image": "ghcr.io/whale-dev/whale-worker:0.1.0",
                            "imagePullPolicy": "IfNotPresent",
                            "command": [
                                "python",
                                "-m",
                                "whale.workloads",
                                "train",
                                "--store",
                                STORE,
                                "--run",
                                "demo",
                                "--phase",
                                "c01-weight",
                            ],
                            "env": [
                                {"name": "WHALE_RUN", "value": "demo"},
                                {"name": "WHALE_PHASE", "value": "c01-weight"},
                                {"name": "WHALE_ATTEMPT", "value": "1"},
                                {"name": "PYTHONUNBUFFERED", "value": "1"},
                                *STORAGE_ENV,
                                {"name": "WHALE_INFERENCE_URL", "value": "http://demo-vllm.team-a.svc:8000/v1"},
                                {"name": "WHALE_SERVED_MODEL_NAME", "value": "Qwen/Qwen3.5-2B"},
                                # the run's vLLM --api-key, by reference only
                                {
                                    "name": "WHALE_INFERENCE_API_KEY",
                                    "valueFrom": {"secretKeyRef": {"name": "demo-auth", "key": "vllm-api-key"}},
                                },
                                {"name": "WHALE_CODE_URL", "value": "http://demo-sandbox.team-a.svc:8080"},
                                {"name": "WHALE_HARNESS_HOST", "value": "demo-harness.team-a.svc:7070"},
                                {
                                    "name": "WHALE_HARNESS_TOKEN",
                                    "valueFrom": {"secretKeyRef": {"name": "demo-auth", "key": "harness-token"}},
                                },
                            ],
                            "envFrom": [{"secretRef": {"name": "whale-s3"}}],
                            "resources": {
                                "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                                # the memory request is the limit unless the spec gives one
                                "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
                            },
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                            # its harness processes run in the run's harness pod: nothing here starts a sandbox
                            "securityContext": RESTRICTED,
                        }
                    ],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}],
                },
            },
        },
    }


def test_workers_without_isolation_get_no_sandbox_capabilities():
    """spec.execution.sandbox.isolation: none starts no sandbox, so the worker is restricted, as the image's plain user."""
    spec = make_spec(sandbox={"isolation": "none", "acknowledgeUnisolated": True})
    for request in (weight_request(spec),):
        pod = builders.job(RUN, spec, request, store_uri=STORE)["spec"]["template"]["spec"]
        assert pod["containers"][0]["securityContext"] == RESTRICTED
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        }


def test_sandbox_host_capabilities_are_exactly_what_the_launcher_needs():
    """Every capability the launcher needs, measured by dropping each from the bounding set (docs/security.md);
    nothing that would let the untrusted program out (the program itself runs with none)."""
    ctx = builders.sandbox_host_security_context()
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert set(ctx["capabilities"]["add"]) == {
        "CHOWN",
        "DAC_OVERRIDE",
        "KILL",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_ADMIN",
    }
    assert "privileged" not in ctx and ctx["seccompProfile"] == {"type": "RuntimeDefault"}


def test_multi_node_train_is_an_indexed_job_with_a_headless_service():
    spec = make_spec(train={"numNodes": 2, "gpusPerNode": 8})
    req = weight_request(spec, attempt=3)
    job = builders.job(RUN, spec, req, store_uri=STORE)
    assert {k: job["spec"][k] for k in ("completionMode", "completions", "parallelism", "backoffLimit")} == {
        "completionMode": "Indexed",
        "completions": 2,
        "parallelism": 2,
        "backoffLimit": 0,
    }
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "demo-c01-weight-3-rdzv"
    worker = pod["containers"][0]
    assert worker["command"] == [
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--node-rank=$(NODE_RANK)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=29500",
        "-m",
        "--",
        "whale.workloads",
        "train",
        "--store",
        STORE,
        "--run",
        "demo",
        "--phase",
        "c01-weight",
    ]
    env = {e["name"]: e for e in worker["env"]}
    assert env["NODE_RANK"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["MASTER_ADDR"]["value"] == "demo-c01-weight-3-0.demo-c01-weight-3-rdzv.team-a.svc"
    assert worker["resources"] == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    assert builders.rendezvous_service(RUN, spec, req) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "demo-c01-weight-3-rdzv",
            "namespace": "team-a",
            "ownerReferences": OWNER,
            "labels": {
                "app.kubernetes.io/name": "whale",
                "app.kubernetes.io/instance": "demo",
                "app.kubernetes.io/managed-by": "whale-operator",
                "whale.dev/run": "demo",
                "app.kubernetes.io/component": "rendezvous",
                "whale.dev/cycle": "1",
                "whale.dev/phase": "c01-weight",
                "whale.dev/attempt": "3",
            },
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": "demo-c01-weight-3"},
            "ports": [{"name": "rendezvous", "port": 29500, "targetPort": 29500}],
        },
    }
    single = make_spec()
    assert builders.rendezvous_service(RUN, single, weight_request(single)) is None


def test_search_job_gets_the_proposer_key_and_eval_job_does_not():
    spec = make_spec()
    search = phase_request(
        spec.to_wire(),
        run="demo",
        phase="c01-harness",
        attempt=1,
        args=HarnessPhaseArgs(
            cycle=1, incoming_harness=None, checkpoint="ck", step=42, iterations=6, archive="runs/demo/archive/c01"
        ),
    )
    ev = phase_request(
        spec.to_wire(),
        run="demo",
        phase="eval-c01-s000042-weight",
        attempt=1,
        args=EvalPhaseArgs(cycle=1, step=42, after="weight", checkpoint="ck", harness=None),
    )
    s_env = builders.job(RUN, spec, search, store_uri=STORE)["spec"]["template"]["spec"]["containers"][0]["env"]
    e_job = builders.job(RUN, spec, ev, store_uri=STORE)
    e_env = e_job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "ANTHROPIC_API_KEY", "valueFrom": {"secretKeyRef": {"name": "proposer", "key": "api-key"}}} in s_env
    assert not any(e["name"] == "ANTHROPIC_API_KEY" for e in e_env)
    assert e_job["metadata"]["name"] == "demo-eval-c01-s000042-weight-1"
    assert e_job["spec"]["template"]["spec"]["containers"][0]["command"][3] == "eval"
    assert "nvidia.com/gpu" not in str(e_job["spec"]["template"]["spec"]["containers"][0].get("resources", {}))


def test_vllm_deployment():
    spec = make_spec(
        inference={"tensorParallelSize": 2, "gpuMemoryUtilization": 0.85, "extraArgs": ["--seed", "1"]},
        model={"name": "Qwen/Qwen3.5-2B", "servedModelName": "policy", "maxModelLen": 32768},
    )
    dep = builders.inference_deployment(RUN, spec, store_uri=STORE)
    # no note of the served checkpoint (the run's status.currentCheckpoint): a new one writes nothing to the Deployment
    assert "annotations" not in dep["metadata"]
    assert dep["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    vllm, sync = pod["containers"]
    assert vllm["image"] == "vllm/vllm-openai:v0.24.0" and vllm["command"] == ["vllm", "serve"]
    assert vllm["args"] == [
        "/models/current",
        "--served-model-name",
        "policy",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "32768",
        "--gpu-memory-utilization",
        "0.85",
        "--max-num-seqs",
        "64",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "qwen3_coder",
        "--seed",
        "1",
    ]
    assert vllm["resources"] == {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}
    assert vllm["startupProbe"] == {
        "httpGet": {"path": "/health", "port": 8000},
        "periodSeconds": 10,
        "failureThreshold": 180,
    }
    assert vllm["readinessProbe"]["httpGet"] == vllm["livenessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    # no memory limit in this spec: /dev/shm still has a size
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": builders.DEFAULT_SHM_SIZE}} in pod["volumes"]
    assert {"name": "models", "emptyDir": {"sizeLimit": "100Gi"}} in pod["volumes"]
    assert sync["command"][:3] == ["python", "-m", "whale.inference.weight_sync"]
    assert pod["initContainers"][0]["command"][-1] == "--once"
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # the checkpoint lives outside the pod template: swapping weights never restarts the pod
    other = builders.inference_deployment(RUN, spec, store_uri=STORE)
    assert other["spec"]["template"] == dep["spec"]["template"]


def test_sandbox_reaches_nothing():
    assert builders.sandbox_network_policy(RUN, tools_of("math_reasoning")[0]) == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "demo-sandbox-isolation",
            "namespace": "team-a",
            "ownerReferences": OWNER,
            "labels": {
                "app.kubernetes.io/name": "whale",
                "app.kubernetes.io/instance": "demo",
                "app.kubernetes.io/managed-by": "whale-operator",
                "whale.dev/run": "demo",
                "app.kubernetes.io/component": "sandbox",
            },
        },
        "spec": {
            "podSelector": {"matchLabels": {"whale.dev/run": "demo", "app.kubernetes.io/component": "sandbox"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"whale.dev/run": "demo"}}}],
                    "ports": [{"protocol": "TCP", "port": 8080}],
                }
            ],
            "egress": [],
        },
    }
    dep = builders.tool_deployment(RUN, make_spec(), tools_of("math_reasoning")[0], store_uri=STORE)
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    c = pod["containers"][0]
    assert "env" not in c and "envFrom" not in c  # no credentials in the sandbox
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["command"][:3] == ["python", "-m", "whale.tools.code_interpreter"]


def test_tools_per_domain():
    """The domain plugin declares its services; the operator builds them from that description."""
    assert [t.name for t in tools_of("search_qa")] == ["retriever"]
    assert [t.name for t in tools_of("math_reasoning")] == ["sandbox"]
    assert tools_of("chess_puzzles") == () and tools_of("synthetic") == ()
    kinds = [m["kind"] for m in builders.tool_children(RUN, make_spec(), tools_of("math_reasoning"), store_uri=STORE)]
    assert kinds == ["Deployment", "Service", "NetworkPolicy"]
    retriever = builders.tool_children(RUN, make_spec(domain="search_qa"), tools_of("search_qa"), store_uri=STORE)
    assert [m["kind"] for m in retriever] == ["Deployment", "Service"]  # not sandboxed: no deny-all policy
    pod = retriever[0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == [
        "python",
        "-m",
        "whale.tools.retriever_service",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--method",
        "bm25",
        "--corpus",
        "/data/wiki_passages.jsonl",
        "--tokenizer",  # the policy's, placed by the init container fetch-tokenizer (see the wiki18 manifest)
        "/tokenizer/policy",
    ]
    fetch = pod["initContainers"][0]
    assert fetch["command"] == [
        "python",
        "-m",
        "whale.tools.fetch",
        STORE,
        "data/search_qa/corpus/wiki_passages.jsonl",
        "/data/wiki_passages.jsonl",
    ]
    assert fetch["envFrom"] == [{"secretRef": {"name": "whale-s3"}}]
    job = builders.job(
        RUN, make_spec(domain="search_qa"), weight_request(make_spec()), store_uri=STORE, tools=tools_of("search_qa")
    )
    assert {"name": "WHALE_RETRIEVER_URL", "value": "http://demo-retriever.team-a.svc:8080"} in job["spec"]["template"][
        "spec"
    ]["containers"][0]["env"]


def test_paper_retriever_serves_the_prepared_wiki18_index_whole_manifest():
    """spec.experiment.domainOptions.corpus wiki18 (a cluster's default): the prepare Job published the e5 index folder in
    the store; the pod streams it whole (marker-gated) onto its volume and serves it."""
    spec = make_spec(domain="search_qa", data={"corpus": "wiki18"})
    [tool] = (
        plugins.load("search_qa").with_options(spec.experiment.domain_options).tool_services_for(spec.experiment.data)
    )
    labels = {
        "app.kubernetes.io/name": "whale",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/managed-by": "whale-operator",
        "whale.dev/run": "demo",
        "app.kubernetes.io/component": "retriever",
    }
    selector = {"whale.dev/run": "demo", "app.kubernetes.io/component": "retriever"}
    probe = {"httpGet": {"path": "/healthz", "port": 8080}}
    assert builders.tool_deployment(RUN, spec, tool, store_uri=STORE) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "demo-retriever", "namespace": "team-a", "labels": labels, "ownerReferences": OWNER},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels, **selector}},
                "spec": {
                    **CPU_PLACEMENT,
                    "automountServiceAccountToken": False,
                    "initContainers": [
                        {
                            "name": "fetch-data",
                            "image": "ghcr.io/whale-dev/whale-tools:0.1.0",
                            "imagePullPolicy": "IfNotPresent",
                            "command": [
                                "python",
                                "-m",
                                "whale.tools.fetch",
                                STORE,
                                "data/search_qa/retriever/wiki18-e5/",
                                "/data/wiki18-e5",
                            ],
                            "env": STORAGE_ENV,
                            "envFrom": [{"secretRef": {"name": "whale-s3"}}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            "resources": builders.HELPER_RESOURCES,
                            "securityContext": RESTRICTED,
                        },
                        {  # the policy's tokenizer, for passages cut in its tokens (the reference's server)
                            "name": "fetch-tokenizer",
                            "image": "ghcr.io/whale-dev/whale-worker:0.1.0",
                            "imagePullPolicy": "IfNotPresent",
                            "command": [
                                "python",
                                "-m",
                                "whale.tools.passage_cut",
                                "--model",
                                "Qwen/Qwen3.5-2B",
                                "--dest",
                                "/tokenizer/policy",
                            ],
                            "env": [{"name": "HF_HOME", "value": "/tokenizer/hf"}, {"name": "HOME", "value": "/tmp"}],
                            "volumeMounts": [{"name": "tokenizer", "mountPath": "/tokenizer"}],
                            "resources": builders.HELPER_RESOURCES,
                            "securityContext": RESTRICTED,
                        },
                    ],
                    "containers": [
                        {
                            "name": "retriever",
                            "image": "ghcr.io/whale-dev/whale-tools:0.1.0",
                            "imagePullPolicy": "IfNotPresent",
                            "command": [
                                "python",
                                "-m",
                                "whale.tools.retriever_service",
                                "--host",
                                "0.0.0.0",
                                "--port",
                                "8080",
                                "--threads",
                                "0",
                                "--index-dir",
                                "/data/wiki18-e5",
                                "--tokenizer",
                                "/tokenizer/policy",
                            ],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "readinessProbe": {**probe, "periodSeconds": 5},
                            "livenessProbe": {**probe, "periodSeconds": 20, "failureThreshold": 3},
                            "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 360},
                            "env": [{"name": "WHALE_CACHE_DIR", "value": "/data/cache"}],
                            "volumeMounts": [
                                {"name": "data", "mountPath": "/data"},
                                {"name": "tokenizer", "mountPath": "/tokenizer", "readOnly": True},
                            ],
                            "resources": {
                                "requests": {"cpu": "8", "memory": "96Gi", "ephemeral-storage": "120Gi"},
                                "limits": {"memory": "96Gi"},
                            },
                            "securityContext": RESTRICTED,
                        }
                    ],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65534,
                        "runAsGroup": 65534,
                        "fsGroup": 65534,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "volumes": [
                        {"name": "data", "emptyDir": {}},
                        {"name": "tokenizer", "emptyDir": {"sizeLimit": "1Gi"}},
                    ],
                },
            },
        },
    }


def test_the_retriever_gets_the_policys_tokenizer_at_its_revision_and_a_gguf_model_none():
    """The retriever cuts passages in the policy's tokens (``--tokenizer``): the init container fetch-tokenizer
    places ``spec.experiment.model``'s tokenizer at its revision; a GGUF model (tokenizer inside the file) gets none, and the
    sandboxed code tool, which counts no tokens, none either."""
    [tool] = tools_of("search_qa")
    pinned = make_spec(domain="search_qa", model={"name": "Qwen/Qwen3.5-2B", "revision": "abc123"})
    pod = builders.tool_deployment(RUN, pinned, tool, store_uri=STORE)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-data", "fetch-tokenizer"]
    assert pod["initContainers"][1]["command"][-2:] == ["--revision", "abc123"]
    assert pod["containers"][0]["command"][-2:] == ["--tokenizer", "/tokenizer/policy"]
    gguf = make_spec(domain="search_qa", model={"name": "/opt/models/tiny", "ggufFile": "tiny.gguf"})
    pod = builders.tool_deployment(RUN, gguf, tool, store_uri=STORE)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-data"]
    assert "--tokenizer" not in pod["containers"][0]["command"]
    assert {v["name"] for v in pod["volumes"]} == {"data"}
    [sandbox] = tools_of("math_reasoning")
    pod = builders.tool_deployment(RUN, make_spec(), sandbox, store_uri=STORE)["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "--tokenizer" not in pod["containers"][0]["command"]


def test_prepare_job_runs_the_prepare_workload_under_the_job_conventions():
    spec = make_spec()
    job = builders.prepare_job(RUN, spec, 2, store_uri=STORE)
    assert job["metadata"]["name"] == "demo-prepare-2"
    assert job["metadata"]["ownerReferences"] == OWNER
    labels = job["metadata"]["labels"]
    assert labels["whale.dev/kind"] == "prepare" and labels["whale.dev/attempt"] == "2"
    assert "whale.dev/phase" not in labels  # not a decide() child
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["podFailurePolicy"] == builders.pod_failure_policy()
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == [
        "python",
        "-m",
        "whale.workloads",
        "prepare",
        "--store",
        STORE,
        "--run",
        "demo",
        "--phase",
        "prepare",
    ]
    assert all(e in c["env"] for e in STORAGE_ENV) and c["envFrom"] == [{"secretRef": {"name": "whale-s3"}}]


def test_names_are_deterministic_and_fit_dns_limits():
    assert names.job_name("demo", "c01-weight", 2) == "demo-c01-weight-2"
    long_run = "r" + "x" * 60
    a = names.job_name(long_run, "eval-c12-s000420-harness", 1)
    b = names.job_name(long_run, "eval-c12-s000420-harness", 2)
    assert len(a) <= names.MAX_JOB_NAME and a.endswith("-eval-c12-s000420-harness-1")
    assert a == names.job_name(long_run, "eval-c12-s000420-harness", 1) and a != b
    assert len(names.rendezvous_service_name(a)) <= 63 and len(names.inference_name(long_run)) <= 63
    with pytest.raises(names.RunNameError, match="starting with a letter"):
        names.check_run_name("1run")


def test_prepare_job_of_full_data_gets_a_bounded_scratch_volume_for_the_downloads():
    spec = make_spec()
    full = spec.with_sections(**{"data": spec.experiment.data.model_copy(update={"source": "full"})})
    pod = builders.prepare_job(RUN, full, 1, store_uri=STORE)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["volumeMounts"] == [{"name": "downloads", "mountPath": builders.PREPARE_DOWNLOADS_DIR}]
    assert {"name": "WHALE_DOWNLOADS_DIR", "value": builders.PREPARE_DOWNLOADS_DIR} in c["env"]
    assert pod["volumes"] == [{"name": "downloads", "emptyDir": {"sizeLimit": builders.PREPARE_DOWNLOADS_SIZE}}]
    sample = builders.prepare_job(RUN, spec, 1, store_uri=STORE)["spec"]["template"]["spec"]
    assert "volumes" not in sample and "volumeMounts" not in sample["containers"][0]


def test_the_doorbell_token_reaches_the_weight_sync_sidecar_alone_and_opens_one_configmap() -> None:
    spec = make_spec()
    pod = builders.inference_deployment(RUN, spec, store_uri=STORE)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-weight-sync" and pod["automountServiceAccountToken"] is False
    mounted = {c["name"]: [m["mountPath"] for m in c["volumeMounts"]] for c in pod["containers"]}
    account = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert account in mounted["weight-sync"] and account not in mounted["vllm"]
    assert all(account not in [m["mountPath"] for m in c["volumeMounts"]] for c in pod["initContainers"])
    sidecar = next(c for c in pod["containers"] if c["name"] == "weight-sync")
    assert {"name": "WHALE_SERVED_CONFIGMAP", "value": "demo-served"} in sidecar["env"]
    cm, account_obj, role, binding = builders.served_doorbell(RUN, spec)
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["ownerReferences"]) == (
        "ConfigMap",
        "demo-served",
        OWNER,
    )
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "whale-operator"  # what the operator watches
    assert account_obj["kind"] == "ServiceAccount" and account_obj["automountServiceAccountToken"] is False
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["demo-served"], "verbs": ["get", "patch"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "demo-weight-sync"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-weight-sync", "namespace": "team-a"}]


def test_a_named_service_account_keeps_its_identity_and_gets_the_doorbell() -> None:
    spec = make_spec(cluster={"serviceAccountName": "whale-workloads"})
    pod = builders.inference_deployment(RUN, spec, store_uri=STORE)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "whale-workloads"
    kinds = [m["kind"] for m in builders.served_doorbell(RUN, spec)]
    assert kinds == ["ConfigMap", "Role", "RoleBinding"]  # no account of the run's own
    assert builders.served_doorbell(RUN, spec)[-1]["subjects"][0]["name"] == "whale-workloads"


def test_a_phase_jobsets_server_has_no_doorbell() -> None:
    # the operator never waits for its acknowledgement: JobSet starts the workload once the server is Ready
    spec = make_spec(inference={"backend": "vllm"}, cluster={"admission": "jobSet"})
    js = builders.phase_jobset(RUN, spec, weight_request(spec), store_uri=STORE)
    server = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "doorbell-token" not in [v["name"] for v in server["volumes"]]
    assert "serviceAccountName" not in server or server["serviceAccountName"] != "demo-weight-sync"


def test_chess_environment_service_has_the_tool_walls():
    """chess_puzzles' environment service (the prototyping kit's ``env``): a restricted pod with no credential and no
    service-account token, its D_harness items fetched by the init container (the only one with the store's
    keys), the run's verifier on its command line, reached only from the run's pods; the workloads get its URL."""
    spec = make_spec(domain="chess_puzzles", verifier={"chessMove": "anyMate"})
    tools = plugins.load("chess_puzzles").tool_services_for(spec.experiment.data)
    assert [t.name for t in tools] == ["env"]
    children = builders.tool_children(RUN, spec, tools, store_uri=STORE)
    assert [m["kind"] for m in children] == ["Deployment", "Service", "NetworkPolicy"]
    pod = children[0]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["securityContext"]["runAsNonRoot"] is True
    [c] = pod["containers"]
    assert c["securityContext"] == {**RESTRICTED, **c["securityContext"]} and "privileged" not in c["securityContext"]
    assert "envFrom" not in c and [e["name"] for e in c["env"]] == ["WHALE_CACHE_DIR"]  # no credential
    assert c["command"][:11] == [
        "python",
        "-m",
        "whale.tools.env_service",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--domain",
        "chess_puzzles",
        "--items",
        "/data/harness.jsonl",
    ]
    assert c["command"][11] == "--verifier" and c["command"][13] == "--domain-options" and len(c["command"]) == 15
    assert json.loads(c["command"][12]) == spec.experiment.verifier.to_wire()  # judges as the episodes do
    assert json.loads(c["command"][14]) == {"chessMove": "anyMate"}  # with the run's options: anyMate here
    [fetch] = pod["initContainers"]
    key = f"data/chess_puzzles/{env_items_key(spec.experiment.data)}"
    assert fetch["command"] == ["python", "-m", "whale.tools.fetch", STORE, key, "/data/harness.jsonl"]
    assert fetch["envFrom"] == [{"secretRef": {"name": "whale-s3"}}]
    policy = children[2]
    assert policy["metadata"]["name"] == "demo-env-isolation"
    assert (
        policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
    )  # the fetch reaches the store
    assert policy["spec"]["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": {"whale.dev/run": "demo"}}}],
            "ports": [{"protocol": "TCP", "port": 8080}],
        }
    ]
    job = builders.job(RUN, spec, weight_request(spec), store_uri=STORE, tools=tools)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "WHALE_ENV_URL", "value": "http://demo-env.team-a.svc:8080"} in env
