"""The operator reads spec.experiment.data.corpus ``auto`` as the paper's corpus (wiki-18) and deploys its retriever."""

from __future__ import annotations

import search_qa
from whale_operator import config


def test_operator_makes_auto_the_papers_corpus_and_keeps_an_explicit_one():
    body = {
        "domain": "search_qa",
        "condition": "whale",
        "model": {"name": "m"},
        "schedule": {"totalEpochs": 1, "weightEpochsPerCycle": 0.5},
        "storage": {"uri": "s3://whale", "endpoint": "minio:9000"},
        "harnessSearch": {"proposer": {"backend": "replay", "script": "proposals.json"}},
    }
    assert config.parse_spec(body).experiment.data.corpus == "wiki18"
    assert config.parse_spec({**body, "data": {"corpus": "local"}}).experiment.data.corpus == "local"
    paper = search_qa.DOMAIN.tool_services_for(config.parse_spec(body).experiment.data)
    assert paper[0].fetch == ((search_qa.WIKI18_INDEX_KEY, "--index-dir"),)
