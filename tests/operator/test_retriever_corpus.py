"""The operator reads spec.experiment.domainOptions.corpus ``auto`` as the paper's corpus (wiki-18) and deploys its retriever."""

from __future__ import annotations

import search_qa
from whale_operator import config
from whale_operator.domains import DomainCatalog


def test_operator_makes_auto_the_papers_corpus_and_keeps_an_explicit_one():
    body = {
        "domain": "search_qa",
        "condition": "whale",
        "model": {"name": "m"},
        "schedule": {"totalEpochs": 1, "weightEpochsPerCycle": 0.5},
        "storage": {"uri": "s3://whale", "endpoint": "minio:9000"},
        "harnessSearch": {"proposer": {"backend": "replay", "script": "proposals.json"}},
    }
    domains = DomainCatalog(config.OperatorConfig())
    spec, judged = domains.effective(config.parse_spec(body))
    assert spec.experiment.domain_options["corpus"] == "wiki18" and not judged
    local, _ = domains.effective(config.parse_spec({**body, "domainOptions": {"corpus": "local"}}))
    assert local.experiment.domain_options["corpus"] == "local"
    paper = domains.tools_for(spec)
    assert paper[0].fetch == ((search_qa.WIKI18_INDEX_KEY, "--index-dir"),)
