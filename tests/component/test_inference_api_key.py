"""The run's shared secret with its vLLM server (``vllm serve --api-key``): every client in the run's pods sends
``Authorization: Bearer <key>`` from ``$WHALE_INFERENCE_API_KEY`` -- the OpenAI client (through the factory the
workloads use), the weight-sync calls and the colocated trainer's sleep/wake calls (``VLLMControl``) -- against
doubles that refuse a missing or wrong key (``tests/fixtures/servers.py``, ``tests/fixtures/vllm_double.py``)."""

from __future__ import annotations

import logging

import pytest

from tests.fixtures.servers import FailureServerDouble
from tests.fixtures.vllm_double import running_vllm_double
from whale.core.spec import WhaleRunSpec
from whale.inference.base import InferenceError, SamplingParams
from whale.inference.factory import make_client
from whale.inference.openai_http import OpenAIClient
from whale.inference.vllm_control import API_KEY_ENV, VLLMControl, WeightSyncError

KEY = "k3y-of-this-run-only"
FAST: dict = {"max_retries": 1, "backoff_s": 0.01, "max_backoff_s": 0.02}


def spec(**inference) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 2},
            "inference": {"backend": "vllm", **inference},
        }
    )


async def test_the_openai_client_sends_the_key_and_a_wrong_one_is_refused(failures: FailureServerDouble, caplog):
    failures.reset(api_key=KEY)
    messages = [{"role": "user", "content": "q"}]
    async with OpenAIClient(failures.url, model="m", **FAST) as anonymous:
        with pytest.raises(InferenceError, match="HTTP 401") as refused:
            await anonymous.chat(messages, SamplingParams())
    assert "WHALE_INFERENCE_API_KEY" in str(refused.value)
    async with OpenAIClient(failures.url, model="m", api_key="wrong", **FAST) as wrong:
        with pytest.raises(InferenceError, match="HTTP 401"):
            await wrong.chat(messages, SamplingParams())
    assert failures.requests == []  # neither reached the endpoint
    # the workloads' client: the key from the environment the operator gives the run's pods
    caplog.set_level(logging.DEBUG)
    client = make_client(spec(), environ={"WHALE_INFERENCE_URL": failures.url, API_KEY_ENV: KEY})
    async with client:
        result = await client.chat(messages, SamplingParams())
    assert result.completions[0].message["content"] == "reply 0"
    assert KEY not in caplog.text  # never logged


def test_the_key_is_never_sent_to_an_endpoint_the_spec_names_and_whale_run_needs_none():
    client = make_client(spec(base_url="https://elsewhere.example/v1"), environ={API_KEY_ENV: KEY})
    assert "Authorization" not in client._headers  # an OpenAIClient
    local = make_client(spec(), environ={"WHALE_INFERENCE_URL": "http://127.0.0.1:1/v1"})  # no key in the env
    assert "Authorization" not in local._headers


def test_the_vllm_control_calls_send_the_key(monkeypatch, tmp_path):
    with running_vllm_double(api_key=KEY) as server:
        monkeypatch.delenv(API_KEY_ENV, raising=False)
        anonymous = VLLMControl(server.url, timeout_s=10)
        with pytest.raises(WeightSyncError, match=f"answered 401.*{API_KEY_ENV}"):
            anonymous.sleep(1)
        anonymous.close()
        assert server.unauthorized == ["/sleep?level=1"]
        # the colocated trainer's and the sidecar's control: the key from the pod's environment
        monkeypatch.setenv(API_KEY_ENV, KEY)
        control = VLLMControl(server.url, timeout_s=10)
        control.sleep(1)
        assert control.is_sleeping()
        control.wake_up()
        assert not control.is_sleeping()
        with pytest.raises(WeightSyncError, match="no checkpoint"):  # reached the reload itself: authenticated
            control.reload_from(str(tmp_path))
        control.close()
        assert server.unauthorized == ["/sleep?level=1"]
