"""The operator's create path refuses a proposer that cannot run — no model, endpoint or key Secret —
naming the field, before it asks for any Job, Deployment or GPU (``whale.metaharness.proposer.spec_problems``)."""

from __future__ import annotations

import pytest

from tests.fixtures.kube import wait_for
from tests.operator.conftest import BASE_SPEC, deep_merge
from tests.operator.player import WR
from whale_operator.config import SpecError, parse_spec

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("proposer", "field"),
    [
        ({"backend": "anthropic", "model": "claude-opus-4-1"}, "spec.experiment.harnessSearch.proposer.apiKeySecret"),
        (
            {"backend": "anthropic", "apiKeySecret": {"name": "p", "key": "k"}},
            "spec.experiment.harnessSearch.proposer.model",
        ),
        (
            {"backend": "openai", "model": "gpt", "apiKeySecret": {"name": "p", "key": "k"}},
            "spec.experiment.harnessSearch.proposer.baseUrl",
        ),
        (
            {"backend": "openai", "model": "gpt", "baseUrl": "https://api.openai.com/v1"},
            "spec.experiment.harnessSearch.proposer.apiKeySecret",
        ),
    ],
)
def test_parse_spec_names_the_missing_proposer_field(proposer: dict, field: str):
    spec = deep_merge(BASE_SPEC, {"storage": {"uri": "s3://b/p", "endpoint": "minio:9000"}})
    spec["harnessSearch"]["proposer"] = proposer
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.field == field


def test_an_rsft_only_run_needs_no_proposer():
    spec = deep_merge(BASE_SPEC, {"condition": "rsft_only", "storage": {"uri": "s3://b/p", "endpoint": "minio:9000"}})
    spec["schedule"] = {"totalSteps": 4}
    del spec["harnessSearch"]
    assert parse_spec(spec).experiment.harness_search.proposer.base_url is None


def test_a_run_without_a_proposer_key_is_failed_before_any_job(start_operator, make_run, kube_cluster, kube_namespace):
    api = kube_cluster.api
    with start_operator():
        run = make_run("nokey", {"harnessSearch": {"proposer": {"apiKeySecret": None}}})
        st = wait_for(lambda: run.status() if run.status().get("phase") == "Failed" else None, what="Failed")
        assert st["reason"] == "InvalidSpec"
        assert st["message"].startswith(
            "spec.experiment.harnessSearch.proposer.apiKeySecret: backend anthropic needs the API key"
        )
        assert run.jobs() == []
        assert api.list("apps/v1", "deployments", kube_namespace) == []
        # the key named (a new generation): the run starts
        api.patch(
            WR,
            "whaleruns",
            kube_namespace,
            "nokey",
            {"spec": {"harnessSearch": {"proposer": {"apiKeySecret": {"name": "whale-proposer", "key": "api-key"}}}}},
        )
        assert run.wait_job()["metadata"]["name"] == "nokey-eval-c00-s000000-start-1"
