"""The run's auth Secret (``<run>-auth``): the operator makes it once with fresh random values and never
overwrites it; the builders hand each pod only the key it needs, by ``secretKeyRef`` (never the value): vLLM gets
``VLLM_API_KEY``, its weight-sync sidecar and the run's workloads ``WHALE_INFERENCE_API_KEY``; nothing else."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.test_builders import RUN, STORE, make_spec, tools_of, weight_request
from whale_operator import builders, names

pytestmark = pytest.mark.timeout(120)

KEY_REF = {"secretKeyRef": {"name": "demo-auth", "key": "vllm-api-key"}}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_auth_secret_builder_and_its_name():
    assert names.auth_secret_name("demo") == "demo-auth"
    secret = builders.auth_secret(RUN, {"vllm-api-key": "a", "harness-token": "b"})
    assert secret["kind"] == "Secret" and secret["type"] == "Opaque"
    assert secret["stringData"] == {"vllm-api-key": "a", "harness-token": "b"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert secret["metadata"]["labels"][names.LABEL_RUN] == "demo"


def test_only_the_pods_that_call_vllm_get_its_key_and_only_by_reference():
    spec = make_spec()
    tools = tools_of("math_reasoning")
    dep = builders.inference_deployment(RUN, spec, store_uri=STORE)
    pod = dep["spec"]["template"]["spec"]
    vllm, sidecar = pod["containers"]
    (fetch,) = pod["initContainers"]
    assert env_of(vllm)["VLLM_API_KEY"] == KEY_REF
    assert env_of(sidecar)["WHALE_INFERENCE_API_KEY"] == KEY_REF
    assert "WHALE_INFERENCE_API_KEY" not in env_of(fetch) and "VLLM_API_KEY" not in env_of(fetch)
    job = builders.job(RUN, spec, weight_request(spec), store_uri=STORE, tools=tools)
    assert env_of(job["spec"]["template"]["spec"]["containers"][0])["WHALE_INFERENCE_API_KEY"] == KEY_REF
    prepare = builders.prepare_job(RUN, spec, 1, store_uri=STORE)
    tool_pods = [m for m in builders.tool_children(RUN, spec, tools, store_uri=STORE) if m["kind"] == "Deployment"]
    assert tool_pods
    for manifest in [prepare, *tool_pods]:
        assert "demo-auth" not in json.dumps(manifest), manifest["metadata"]["name"]
    # an external endpoint (inference.backend openai) gets no vLLM key (only the harness host's caller token)
    external = make_spec(inference={"backend": "openai", "baseUrl": "https://models.example/v1"})
    ext_job = builders.job(RUN, external, weight_request(external), store_uri=STORE, tools=tools)
    assert "vllm-api-key" not in json.dumps(ext_job)
    refs = {
        e["valueFrom"]["secretKeyRef"]["key"]
        for e in ext_job["spec"]["template"]["spec"]["containers"][0]["env"]
        if "secretKeyRef" in e.get("valueFrom", {}) and e["valueFrom"]["secretKeyRef"]["name"] == "demo-auth"
    }
    assert refs == {"harness-token"}
    # a key travels by reference only: no manifest but the Secret itself holds a value
    for manifest in [dep, job]:
        assert "stringData" not in json.dumps(manifest)


def test_the_operator_creates_the_secret_once_and_never_overwrites_it(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    api = kube_cluster.api
    # a Secret already there (e.g. restored from a backup) is kept as it is
    kept = base64.b64encode(b"chosen-by-the-admin").decode()
    api.create(
        "v1",
        "secrets",
        kube_namespace,
        {"metadata": {"name": "other-auth"}, "type": "Opaque", "data": {"vllm-api-key": kept}},
    )
    with start_operator():
        run = make_run("auth")
        secret = wait_for(lambda: api.get("v1", "secrets", kube_namespace, "auth-auth"), what="the auth Secret")
        values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        assert set(values) == {"vllm-api-key", "harness-token"}
        assert all(len(v) >= 40 for v in values.values()) and values["vllm-api-key"] != values["harness-token"]
        assert secret["metadata"]["ownerReferences"][0]["name"] == "auth"
        run.finish(run.wait_job())  # the next phase ensures the infra again
        run.wait_job()
        again = api.get("v1", "secrets", kube_namespace, "auth-auth")
        assert again["data"] == secret["data"]
        assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
        other = make_run("other")
        other.wait_job()
        assert api.get("v1", "secrets", kube_namespace, "other-auth")["data"] == {"vllm-api-key": kept}
