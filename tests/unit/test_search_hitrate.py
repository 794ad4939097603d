"""The answer-in-top-k measure behind docs/data.md's hit-rate table (pure, with a fixed retriever)."""

from __future__ import annotations

from search_qa.hitrate import answer_in, hit_rates
from search_qa.verifier import normalize
from whale.tools.retrieval_index import Hit, Passage


def test_answer_in_needs_whole_words_and_ignores_yes_no():
    text = normalize("Paris is the capital of France; it was founded long ago.")
    assert answer_in(text, ["The Paris"])
    assert not answer_in(text, ["Par"])  # not a whole-word span
    assert not answer_in(text, ["yes"]) and not answer_in(normalize("yes indeed"), ["Yes"])


class FixedRetriever:
    """A test double: each query's passages are given in advance."""

    def __init__(self, results: dict[str, list[str]]):
        self.results = results

    def search(self, queries, topk):
        return [[Hit(Passage(str(i), "t", t, t), 1.0) for i, t in enumerate(self.results[q][:topk])] for q in queries]


def test_hit_rates_per_subset_and_k():
    r = FixedRetriever({"q1": ["nothing here", "the answer is Lyon"], "q2": ["Berlin wall"], "q3": ["no"]})
    items = [
        {"question": "q1", "golden_answers": ["Lyon"], "subset": "a"},
        {"question": "q2", "golden_answers": ["Berlin"], "subset": "a"},
        {"question": "q3", "golden_answers": ["Rome"], "subset": "b"},
    ]
    assert hit_rates(items, r, [1, 2]) == {"a": {1: 0.5, 2: 1.0}, "b": {1: 0.0, 2: 0.0}}
