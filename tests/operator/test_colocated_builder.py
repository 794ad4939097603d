"""The colocated train pod (``inference.placement: colocated``): a pure builder, compared as dicts.
One pod: the trainer and a vLLM server (a native sidecar, sleep mode on) on the same GPUs through one
DRA claim; weights synced through a shared folder."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.http_double import DoubleHTTPServer
from tests.operator.test_builders import RUN, STORE, make_spec, tools_of, weight_request
from whale.core.protocol import EvalPhaseArgs, phase_request
from whale_operator import builders


def colocated(**inference):
    return make_spec(train={"gpusPerNode": 4}, inference={"backend": "vllm", "placement": "colocated", **inference})


def test_the_colocated_train_pod():
    spec = colocated(sleepLevel=2, colocatedGpuMemoryUtilization=0.3)
    request = weight_request(spec)
    job = builders.colocated_train_job(RUN, spec, request, store_uri=STORE, tools=tools_of("math_reasoning"))
    plain = builders.job(RUN, spec, request, store_uri=STORE, tools=tools_of("math_reasoning"))
    assert job["metadata"] == plain["metadata"] and job["kind"] == "Job"
    pod = job["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    fetch, vllm = pod["initContainers"]
    # the server: a native sidecar, started (and healthy) before the trainer, on its share of the same GPUs
    assert vllm["restartPolicy"] == "Always"
    assert vllm["startupProbe"]["exec"]["command"] == ["python3", "-c", builders.LOOPBACK_HEALTH_PROBE]
    args = vllm["args"]
    assert args[-1] == "--enable-sleep-mode"
    # only the trainer beside it calls it: loopback, no port for other pods, no pickled input accepted
    assert args[args.index("--host") + 1] == "127.0.0.1" and "ports" not in vllm
    assert "--weight-transfer-config" not in args and "INSECURE" not in str(vllm["env"])
    assert "shareProcessNamespace" not in pod
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.3"
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in vllm["env"]
    assert fetch["command"][-1] == "--once"  # the serving target's weights, before the server starts
    # one DRA claim of the pod's GPUs, taken by both containers; no device-plugin GPUs anywhere
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "demo-c01-weight-1-gpus"}]
    assert worker["resources"]["claims"] == vllm["resources"]["claims"] == [{"name": "gpus"}]
    for container in (*pod["initContainers"], *pod["containers"]):
        assert builders.GPU_RESOURCE not in str(container.get("resources", {})), container["name"]
    # the trainer samples from the server beside it and syncs through the shared folder
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["WHALE_INFERENCE_URL"] == "http://127.0.0.1:8000/v1"
    assert env["WHALE_SYNC_DIR"] == env["WHALE_SYNC_SERVER_DIR"] == "/sync"
    assert [e["name"] for e in worker["env"]].count("WHALE_INFERENCE_URL") == 1
    sync_mount = {"name": "sync", "mountPath": "/sync"}
    assert sync_mount in worker["volumeMounts"] and sync_mount in vllm["volumeMounts"]
    assert {"name": "sync", "emptyDir": {}} in pod["volumes"]
    # the rest is the plain train Job's
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert worker["command"] == plain["spec"]["template"]["spec"]["containers"][0]["command"]


def test_cuda_ipc_weight_sync_turns_on_vllms_ipc_engine_in_one_pid_namespace():
    spec = make_spec(
        train={"gpusPerNode": 1}, inference={"backend": "vllm", "placement": "colocated", "weightSync": "cudaIpc"}
    )
    job = builders.colocated_train_job(RUN, spec, weight_request(spec), store_uri=STORE, tools=())
    pod = job["spec"]["template"]["spec"]
    vllm = pod["initContainers"][1]
    args = vllm["args"]
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {"backend": "ipc"}
    assert {"name": "VLLM_ALLOW_INSECURE_SERIALIZATION", "value": "1"} in vllm["env"]
    assert pod["shareProcessNamespace"] is True  # CUDA IPC maps the trainer's memory only in its PID namespace
    assert args[args.index("--host") + 1] == "127.0.0.1"


def test_a_server_that_never_sleeps_runs_without_sleep_mode():
    for level, sleeps in ((0, False), (1, True), (2, True)):
        spec = colocated(sleepLevel=level)
        job = builders.colocated_train_job(RUN, spec, weight_request(spec), store_uri=STORE, tools=())
        args = job["spec"]["template"]["spec"]["initContainers"][1]["args"]
        assert ("--enable-sleep-mode" in args) is sleeps, level


def test_the_loopback_probe_passes_on_a_healthy_server_and_fails_without_one():
    """The probe the kubelet runs in the vLLM container (python3 -c ...), against a real server on
    loopback at the server's port."""
    import http.server
    import subprocess
    import sys
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    try:
        server = DoubleHTTPServer(("127.0.0.1", builders.VLLM_PORT), Health)
    except OSError:
        pytest.skip(f"port {builders.VLLM_PORT} is taken on this machine")
    probe = [sys.executable, "-c", builders.LOOPBACK_HEALTH_PROBE]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode != 0


def test_the_gpu_claim_template():
    spec = colocated()
    claim = builders.colocated_gpu_claim_template(RUN, spec, weight_request(spec))
    assert claim["apiVersion"] == "resource.k8s.io/v1" and claim["kind"] == "ResourceClaimTemplate"
    assert claim["metadata"]["name"] == "demo-c01-weight-1-gpus"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert claim["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4}}
    ]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"train": {"numNodes": 2, "gpusPerNode": 4}}, "spec.execution.train.numNodes is 2"),
        ({"train": {"gpusPerNode": 0}}, "spec.execution.train.gpusPerNode is 0"),
        (
            {
                "train": {"gpusPerNode": 2},
                "inference": {"backend": "vllm", "placement": "colocated", "tensorParallelSize": 4},
            },
            "spec.execution.inference.tensorParallelSize (4)",
        ),
        (
            {"inference": {"backend": "vllm", "placement": "separate"}},
            "spec.execution.inference.placement is not colocated",
        ),
    ],
)
def test_specs_it_cannot_render_are_refused_naming_the_field(over, field):
    spec = make_spec(**{"inference": {"backend": "vllm", "placement": "colocated"}, **over})
    with pytest.raises(builders.ColocatedPlacementError, match=field.replace("(", r"\(").replace(")", r"\)")):
        builders.colocated_train_job(RUN, spec, weight_request(spec), store_uri=STORE)


def test_only_a_weight_phase_is_colocated():
    spec = colocated()
    request = phase_request(
        spec,
        run="demo",
        phase="c00-eval-base",
        attempt=1,
        args=EvalPhaseArgs(checkpoint=None, harness=None, step=0, cycle=0, after="start"),
    )
    with pytest.raises(builders.ColocatedPlacementError, match="only a weight phase trains"):
        builders.colocated_train_job(RUN, spec, request, store_uri=STORE)
