"""search_qa's options (``spec.experiment.domainOptions``): the retrieval corpus and how an answer is scored."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from whale.domain import DomainOptions


class SearchOptions(DomainOptions):
    corpus: Literal["auto", "local", "wiki18"] = Field(
        "auto",
        description="the retrieval corpus, and with it the training questions: local = BM25 over the shipped "
        "passages, D_weight/D_harness only the questions whose answer BM25 retrieves in the top 5; wiki18 = the "
        "paper's e5-base-v2 over wiki-18 (21 M passages, prepared on the cluster), every training question; auto = "
        "wiki18 on a cluster (the operator), local in `whale run`",
    )
    search_answer: Literal["exactMatch", "llmJudge"] = Field(
        "exactMatch",
        description="exactMatch (the reference scripts' default, LLM_JUDGE=0) = normalised exact match of the last "
        "<answer>, 0.25 for a tag-spamming reply; llmJudge = the reference's LLM judge option (its docs/data.md's "
        "verifier): spec.experiment.verifier.judge says whether the answer names the same entity as a gold one, 1 "
        "or 0, exact match when the judge fails three times",
    )
