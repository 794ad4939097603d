"""The operator refuses a run that scores with an LLM judge needing a key but names no Secret for it
(``spec.experiment.verifier.judge.apiKeySecret``), before any Job exists; with the Secret named, the run starts and the Jobs that
score hold the key by reference (``whale_operator.builders.judge_key_env``)."""

from __future__ import annotations

import pytest

from tests.fixtures.kube import wait_for

pytestmark = pytest.mark.timeout(120)

JUDGE_SECRET = {"name": "judge-key", "key": "api-key"}


def test_a_judge_without_its_key_secret_is_refused_before_any_job(
    start_operator, make_run, kube_cluster, kube_namespace
):
    api = kube_cluster.api
    with start_operator():
        run = make_run("nojudgekey", {"domain": "search_qa", "domainOptions": {"searchAnswer": "llmJudge"}})
        st = wait_for(lambda: run.status() if run.status().get("phase") == "Failed" else None, what="Failed")
        assert st["reason"] == "InvalidSpec"
        assert st["message"].startswith(
            "spec.experiment.verifier.judge.apiKeySecret: the judge's key ($OPENAI_API_KEY)"
        )
        assert run.jobs() == []
        assert api.list("apps/v1", "deployments", kube_namespace) == []
        keyed = make_run(
            "judgekey",
            {
                "domain": "search_qa",
                "domainOptions": {"searchAnswer": "llmJudge"},
                "verifier": {"judge": {"apiKeySecret": JUDGE_SECRET}},
            },
        )
        job = keyed.wait_job()
        env = job["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": JUDGE_SECRET}} in env
