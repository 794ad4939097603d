"""The phase Jobs (train = RSFT weight phase, search = Meta-Harness phase, eval = mean@k; Indexed with a headless
rendezvous Service when ``spec.execution.train.numNodes`` > 1), the prepare Job, the workloads' environment and their
NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

from whale.core import layout
from whale.core.layout import PhaseId
from whale.core.protocol import PhaseKind, PhaseRequest
from whale.domain import ToolService
from whale.metaharness.proposer import AGENT_EXCHANGE_ENV, DEFAULT_KEY_ENV
from whale_operator import names
from whale_operator.builders.auth import inference_api_key_env
from whale_operator.builders.harness import (
    AGENT_EXCHANGE_DIR,
    agent_exchange_mount,
    agent_volumes,
    harness_host_env,
    proposer_agent_container,
    runs_cli_agent,
)
from whale_operator.builders.pods import (
    PREPARE_DOWNLOADS_DIR,
    PREPARE_DOWNLOADS_SIZE,
    RENDEZVOUS_PORT,
    TRAIN,
    WORKER_CONTAINER,
    WORKER_UID,
    WORKERS,
    Manifest,
    RunRef,
    component_resources,
    hf_token_env,
    inference_url,
    job_lifecycle,
    pod_metadata,
    pod_template_fields,
    requests_gpu,
    resources_dict,
    restricted_container_security_context,
    restricted_pod_security_context,
    secret_key_env,
    served_model_name,
    shm_volume,
    storage_env,
    storage_env_from,
    untrusted,
    uses_vllm,
    with_queue,
)
from whale_operator.cluster_spec import ClusterRunSpec

# ----- the workloads' environment ----------------------------------------------------------------


def tool_url(run: RunRef, tool: ToolService) -> str:
    return f"http://{names.tool_name(run.name, tool.name)}.{run.namespace}.svc:{tool.port}"


def workload_env(
    run: RunRef, spec: ClusterRunSpec, request: PhaseRequest, tools: tuple[ToolService, ...]
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "WHALE_RUN", "value": run.name},
        {"name": "WHALE_PHASE", "value": request.phase},
        {"name": "WHALE_ATTEMPT", "value": str(request.attempt)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *storage_env(spec),
    ]
    url = inference_url(run, spec)
    if url:
        env.append({"name": "WHALE_INFERENCE_URL", "value": url})
        env.append({"name": "WHALE_SERVED_MODEL_NAME", "value": served_model_name(spec)})
    if uses_vllm(spec):  # the run's own server: its shared secret (an external endpoint gets nothing of ours)
        env.append(inference_api_key_env(run))
    for tool in tools:
        env.append({"name": tool.url_env, "value": tool_url(run, tool)})
    key = spec.experiment.harness_search.proposer.api_key_secret
    if request.kind is PhaseKind.HARNESS and key is not None and not runs_cli_agent(spec, request.kind):
        # a built-in proposer calls its API from the search; a cli agent's key is its own container's
        env.append(secret_key_env(key.env or DEFAULT_KEY_ENV, key))
    env += judge_key_env(spec)
    if request.kind is PhaseKind.WEIGHT:  # the trainer loads spec.experiment.model (a Hub id at the first phase)
        env += hf_token_env(spec)
    return env


def judge_key_env(spec: ClusterRunSpec) -> list[dict[str, Any]]:
    """The LLM judge's API key (``spec.experiment.verifier.judge.apiKeySecret`` under ``apiKeyEnv``) for a pod that scores
    episodes, when the run scores with the judge: the eval, weight and harness-search Jobs (:func:`workload_env`),
    never the harness host, the tool services or the prepare Job. A ``cli`` proposer's sandbox in the search pod
    gets none of the pod's environment (docs/metaharness.md). The operator's spec names the Secret only where the
    domain's options score with the judge (``DomainCatalog.effective``)."""
    judge = spec.experiment.verifier.judge
    if judge.api_key_secret is None or judge.api_key_env is None:
        return []
    return [secret_key_env(judge.api_key_env, judge.api_key_secret)]


# ----- Jobs ---------------------------------------------------------------------------------------


def pod_failure_policy() -> dict[str, Any]:
    """Preemption/eviction (DisruptionTarget) does not count as a failure: the pod is recreated and
    the workload resumes from its state. A program error (non-zero exit) fails the attempt at once."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": WORKER_CONTAINER, "operator": "NotIn", "values": [0]},
            },
        ]
    }


def workload_command(spec: ClusterRunSpec, request: PhaseRequest, store_uri: str) -> list[str]:
    """``python -m whale.workloads <kind> ...``; torchrun in front of a multi-GPU / multi-node train."""
    module = [
        "whale.workloads",
        request.kind.workload,
        "--store",
        store_uri,
        "--run",
        request.run,
        "--phase",
        request.phase,
    ]
    tr = spec.execution.train
    if request.kind is PhaseKind.WEIGHT and (tr.num_nodes > 1 or tr.gpus_per_node > 1):
        return [
            "torchrun",
            f"--nnodes={tr.num_nodes}",
            f"--nproc-per-node={max(tr.gpus_per_node, 1)}",
            "--node-rank=$(NODE_RANK)",
            "--master-addr=$(MASTER_ADDR)",
            f"--master-port={RENDEZVOUS_PORT}",
            # NOTE: "--" ends torchrun's options; without it torchrun reads the workload's --run as
            # an abbreviation of its own --run-path and refuses to start
            "-m",
            "--",
            *module,
        ]
    return ["python", "-m", *module]


def job(
    run: RunRef, spec: ClusterRunSpec, request: PhaseRequest, *, store_uri: str, tools: tuple[ToolService, ...] = ()
) -> Manifest:
    """The Job of one phase attempt: train (weight), search (harness) or eval."""
    name = names.job_name(run.name, request.phase, request.attempt)
    kind = request.kind
    cycle = _request_cycle(request)
    labels = with_queue(
        {
            **names.child_labels(run.name, kind.workload, cycle=cycle, phase=request.phase, attempt=request.attempt),
            names.LABEL_KIND: kind.value,
        },
        spec,
    )
    multi_node = kind is PhaseKind.WEIGHT and spec.execution.train.num_nodes > 1
    if kind is PhaseKind.WEIGHT:
        component = TRAIN
        resources = resources_dict(
            component_resources(spec, TRAIN, spec.execution.train.resources), spec.execution.train.gpus_per_node
        )
    else:
        component = WORKERS
        resources = resources_dict(component_resources(spec, WORKERS, spec.cluster.worker_resources))

    env = workload_env(run, spec, request, tools) + harness_host_env(run, spec)
    if multi_node:
        env += [
            {"name": "WHALE_NUM_NODES", "value": str(spec.execution.train.num_nodes)},
            {
                "name": "NODE_RANK",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
                },
            },
            {"name": "MASTER_ADDR", "value": f"{name}-0.{names.rendezvous_service_name(name)}.{run.namespace}.svc"},
            {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        ]
    elif kind is PhaseKind.WEIGHT and spec.execution.train.gpus_per_node > 1:
        env += [{"name": "NODE_RANK", "value": "0"}, {"name": "MASTER_ADDR", "value": "127.0.0.1"}]

    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.cluster.images.worker,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "command": workload_command(spec, request, store_uri),
        "env": env,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    # restricted whatever runs beside it: harness code runs on the harness host, a cli agent in its own container
    container["securityContext"] = restricted_container_security_context()
    pod_security = restricted_pod_security_context(spec, component, WORKER_UID)
    agent = runs_cli_agent(spec, kind)
    if agent:  # it hands the agent's sessions to the proposer-agent container through the exchange directory
        container["env"].append({"name": AGENT_EXCHANGE_ENV, "value": AGENT_EXCHANGE_DIR})
        container["volumeMounts"].append(agent_exchange_mount())
    env_from = storage_env_from(spec)
    if env_from:
        container["envFrom"] = env_from
    if resources:
        container["resources"] = resources
    if multi_node:
        container["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}]

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        **pod_template_fields(spec, component, gpu=requests_gpu(resources)),
        # no workload calls the Kubernetes API: no token (a workload identity's own projected token, which its
        # webhook adds as a volume of its own, is not affected)
        "automountServiceAccountToken": False,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": [shm_volume(resources)],
    }
    if multi_node:
        pod_spec["subdomain"] = names.rendezvous_service_name(name)
    if agent:  # its own container: the agent's key and the sandbox host's context; no shared PID namespace
        pod_spec["initContainers"] = [proposer_agent_container(spec, [tool_url(run, tool) for tool in tools])]
        pod_spec["shareProcessNamespace"] = False
        pod_spec["volumes"] += agent_volumes()
    template_labels = untrusted(labels) if agent else labels

    job_spec: dict[str, Any] = {
        # all-or-nothing: a failed pod fails the attempt; the next attempt resumes from the checkpoint
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(),
        "template": {"metadata": pod_metadata(spec, component, template_labels), "spec": pod_spec},
        **job_lifecycle(spec),
    }
    if multi_node:
        job_spec.update(
            completionMode="Indexed",
            completions=spec.execution.train.num_nodes,
            parallelism=spec.execution.train.num_nodes,
        )

    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": run.metadata(name, labels, {names.ANNOTATION_REQUEST: layout.request_key(run.name, request.phase)}),
        "spec": job_spec,
    }


def prepare_job(run: RunRef, spec: ClusterRunSpec, attempt: int, *, store_uri: str) -> Manifest:
    """The Job that materialises the run's data splits and writes their sizes
    (``python -m whale.workloads prepare``; reads ``layout.spec_key``, writes
    ``layout.split_sizes_key`` last). The attempt of ``decide()``'s phase ``prepare``: no phase label, its kind
    and ``whale.dev/attempt`` label say which (``observe.current_jobs``)."""
    name = names.prepare_job_name(run.name, attempt)
    labels = with_queue(
        {**names.child_labels(run.name, names.PREPARE, attempt=attempt), names.LABEL_KIND: names.PREPARE}, spec
    )
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.cluster.images.worker,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "command": [
            "python",
            "-m",
            "whale.workloads",
            names.PREPARE,
            "--store",
            store_uri,
            "--run",
            run.name,
            "--phase",
            names.PREPARE,
        ],
        "env": [
            {"name": "WHALE_RUN", "value": run.name},
            {"name": "WHALE_ATTEMPT", "value": str(attempt)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *storage_env(spec),
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # it fetches and splits data, it runs no harness: restricted whatever spec.execution.sandbox says
        "securityContext": restricted_container_security_context(),
    }
    env_from = storage_env_from(spec)
    if env_from:
        container["envFrom"] = env_from
    resources = resources_dict(component_resources(spec, WORKERS, spec.cluster.worker_resources))
    if resources:
        container["resources"] = resources
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        **pod_template_fields(spec, WORKERS, gpu=requests_gpu(resources)),
        "automountServiceAccountToken": False,
        "securityContext": restricted_pod_security_context(spec, WORKERS, WORKER_UID),
        "containers": [container],
    }
    if spec.experiment.data.source == "full":
        # the full datasets are downloaded here before they go to the store (whale.data.full): scratch
        # disk for them, not the container's writable layer
        container["volumeMounts"] = [{"name": "downloads", "mountPath": PREPARE_DOWNLOADS_DIR}]
        container["env"].append({"name": "WHALE_DOWNLOADS_DIR", "value": PREPARE_DOWNLOADS_DIR})
        pod["volumes"] = [{"name": "downloads", "emptyDir": {"sizeLimit": PREPARE_DOWNLOADS_SIZE}}]
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(),
        "template": {"metadata": pod_metadata(spec, WORKERS, labels), "spec": pod},
        **job_lifecycle(spec),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": run.metadata(name, labels, {names.ANNOTATION_REQUEST: layout.spec_key(run.name)}),
        "spec": job_spec,
    }


def rendezvous_service(run: RunRef, spec: ClusterRunSpec, request: PhaseRequest) -> Manifest | None:
    """Headless Service for an Indexed train Job: pod ``<job>-<i>`` resolves as
    ``<job>-<i>.<job>-rdzv``; torchrun's master is index 0. None when the Job is single-node."""
    if request.kind is not PhaseKind.WEIGHT or spec.execution.train.num_nodes <= 1:
        return None
    job_name = names.job_name(run.name, request.phase, request.attempt)
    labels = names.child_labels(
        run.name, "rendezvous", cycle=_request_cycle(request), phase=request.phase, attempt=request.attempt
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": run.metadata(names.rendezvous_service_name(job_name), labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": job_name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}],
        },
    }


def _request_cycle(request: PhaseRequest) -> int:
    return PhaseId.parse(request.phase).cycle


WORKLOAD_COMPONENTS = ("train", "search", "eval", names.PREPARE)


def workload_network_policy(run: RunRef) -> Manifest:
    """Nothing but the run's own pods reaches a workload pod: torchrun's rendezvous (:data:`RENDEZVOUS_PORT`, which
    authenticates no one) and the ports NCCL and the process group open between a multi-node train's ranks, which
    are random, hence every port. The workloads serve nothing else; egress is left open (the store, vLLM, the tools,
    a proposer's API)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(names.workload_policy_name(run.name), names.child_labels(run.name, "workloads")),
        "spec": {
            "podSelector": {
                "matchLabels": {names.LABEL_RUN: run.name},
                "matchExpressions": [
                    {"key": "app.kubernetes.io/component", "operator": "In", "values": list(WORKLOAD_COMPONENTS)}
                ],
            },
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {names.LABEL_RUN: run.name}}}]}],
        },
    }
