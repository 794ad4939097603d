"""The search_qa domain: open-domain QA with a search tool (docs/data.md#search_qa).

Registered under ``whale.domains`` as ``search_qa = "search_qa:DOMAIN"``. Items are the raw row format
``{"id", "question", "golden_answers"}`` plus ``"subset"`` (the benchmark) for test items. D_test is 100
questions from each available benchmark (TriviaQA is missing from the shared data: reported in
:data:`search_qa.data.MISSING_BENCHMARKS` and in the eval notes). The tool is ``search``
(``search_qa.env``), served by ``$WHALE_RETRIEVER_URL`` when set (the cluster's ``/retrieve`` service),
else by an in-process index over the shared corpus (``$WHALE_SEARCH_CORPUS`` overrides the file,
``$WHALE_RETRIEVER_METHOD`` picks ``bm25`` or ``dense``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.domain import DEFAULT_ALLOWED_IMPORTS, SplitsInMemoryDomain, DomainError, ToolService, data_root, default_data_root

if TYPE_CHECKING:
    from search_qa.env import SearchEnvironment
    from whale.tools.retrieval import Retriever
    from whale.spec import Data

HERE = Path(__file__).resolve().parent
CORPUS_ENV = "WHALE_SEARCH_CORPUS"
METHOD_ENV = "WHALE_RETRIEVER_METHOD"


class SearchQA(SplitsInMemoryDomain):
    name = "search_qa"
    allowed_imports = DEFAULT_ALLOWED_IMPORTS | {"json", "string", "textwrap"}
    #: h0 uses 2; a candidate may search more often, never more than this many model calls
    max_turns_limit = 8
    #: on a cluster retrieval goes to the run's BM25 retriever service ($WHALE_RETRIEVER_URL) over the
    #: corpus materialised in the store
    tool_services = (ToolService(name="retriever", module="whale.tools.retriever", url_env="WHALE_RETRIEVER_URL",
                                 args=("--method", "bm25"), fetch=(("corpus/wiki_passages.jsonl", "--corpus"),)),)

    def __init__(self, retriever: Retriever | None = None) -> None:
        """``retriever``: the retriever to use (tests, benchmarks); default resolved from the environment."""
        self._retriever = retriever
        self._lock = threading.Lock()

    def build_splits(self, data: Data) -> dict[str, list[dict[str, Any]]]:
        from search_qa.data import load_splits

        return load_splits(data_root(data), seed=data.seed, harness_size=data.harness_size,
                           weight_size=data.weight_size, test_size=data.test_size)

    def notes(self) -> list[str]:
        """What the eval result should say about the test split (benchmarks missing from the data)."""
        from search_qa.data import MISSING_BENCHMARKS

        return [f"benchmark {b} is missing from the shared data; D_test uses the other six"
                for b in MISSING_BENCHMARKS]

    def item_from_raw(self, raw: dict[str, Any]) -> dict[str, Any]:
        from search_qa.data import to_item

        if "id" not in raw:
            raise DomainError('a search_qa item needs "id", "question" and "golden_answers"')
        item = to_item(raw, "raw")
        if raw.get("subset"):
            item["subset"] = str(raw["subset"])
        return item

    def retriever(self):
        """The retriever every episode of this process shares (resolved once, from the environment)."""
        with self._lock:
            if self._retriever is None:
                from search_qa.data import corpus_path
                from whale.tools.client import retriever_from_env

                corpus = os.environ.get(CORPUS_ENV) or corpus_path(default_data_root())
                self._retriever = retriever_from_env(Path(corpus), os.environ.get(METHOD_ENV, "bm25"))
            return self._retriever

    def make_env(self, item: dict[str, Any]) -> SearchEnvironment:
        from search_qa.env import SearchEnvironment

        return SearchEnvironment(item, self.retriever)

    def tool_specs(self) -> list[dict[str, Any]]:
        from search_qa.env import TOOL_SPEC

        return [TOOL_SPEC]

    def subset(self, item: dict[str, Any]) -> str:
        return str(item.get("subset") or "train")

    def h0_path(self) -> Path:
        return HERE / "h0.py"

    def skill_path(self) -> Path:
        return HERE / "SKILL.md"


DOMAIN = SearchQA()
