"""The search_qa domain: open-domain QA with a search tool (docs/data.md#search_qa).

Registered under ``whale.domains`` as ``search_qa = "search_qa:DOMAIN"``. Items are the raw row format
``{"id", "question", "golden_answers"}`` plus ``"subset"`` (the benchmark) for test items. D_test is 100
questions from each of the seven benchmarks the data has (TriviaQA is missing from the sample data: the
eval notes name every benchmark the test split lacks). The tool is ``search``
(``search_qa.env``).

``spec.experiment.domainOptions.corpus`` picks the retrieval corpus and, with it, the training questions
(:mod:`search_qa.data`): ``local`` (``whale run``'s default) = BM25 over the shipped passages and the
training questions it can answer; ``wiki18`` (a cluster's default, the paper's) = e5-base-v2 over wiki-18
and every training question. Retrieval goes to ``$WHALE_RETRIEVER_URL`` when set (the cluster's
``/retrieve`` service, waited for before the first episode), else to a prepared dense index named by
``$WHALE_SEARCH_INDEX``, else (local corpus only) to an in-process index over the shipped corpus
(``$WHALE_SEARCH_CORPUS`` overrides the file, ``$WHALE_RETRIEVER_METHOD`` picks ``bm25`` or ``dense``).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from search_qa.options import SearchOptions
from whale.domain import (
    DEFAULT_ALLOWED_IMPORTS,
    DomainError,
    SplitsInMemoryDomain,
    ToolService,
    data_prefix,
    data_root,
    default_data_root,
)

if TYPE_CHECKING:
    from search_qa.env import SearchEnvironment
    from search_qa.judge import Judge
    from whale.domain import Data, FullData, Retriever, Store, Verifier

HERE = Path(__file__).resolve().parent
CORPUS_ENV = "WHALE_SEARCH_CORPUS"
METHOD_ENV = "WHALE_RETRIEVER_METHOD"
RETRIEVER_URL_ENV = "WHALE_RETRIEVER_URL"
#: store keys under ``data/search_qa/`` the retriever services fetch
LOCAL_CORPUS_KEY = "corpus/wiki_passages.jsonl"
WIKI18_INDEX_KEY = "retriever/wiki18-e5/"

#: BM25 over the shipped corpus, which the prepare workload copies into the store
LOCAL_RETRIEVER = ToolService(
    name="retriever",
    module="whale.tools.retriever_service",
    url_env=RETRIEVER_URL_ENV,
    args=("--method", "bm25"),
    fetch=((LOCAL_CORPUS_KEY, "--corpus"),),
    tokenizer_flag="--tokenizer",  # passages cut in the policy's tokens, as the reference's server cuts
)
#: the paper's: e5-base-v2 over wiki-18's 21 M passages, an index the prepare workload downloads (Search-R1's
#: release) and publishes in the store; the pod holds the 14 GB corpus + 65 GB index on its volume and maps
#: the index (memory for the page cache, CPUs for exact search)
WIKI18_RETRIEVER = ToolService(
    name="retriever",
    module="whale.tools.retriever_service",
    url_env=RETRIEVER_URL_ENV,
    args=("--threads", "0"),
    fetch=((WIKI18_INDEX_KEY, "--index-dir"),),
    requests=(("cpu", "8"), ("memory", "96Gi"), ("ephemeral-storage", "120Gi")),
    tokenizer_flag="--tokenizer",
)


class SearchQA(SplitsInMemoryDomain):
    name = "search_qa"
    allowed_imports = DEFAULT_ALLOWED_IMPORTS | {"json", "string", "textwrap"}
    #: h0 uses 2; a candidate may search more often, never more than this many model calls: the reference's
    #: MAX_TURNS_HARD_CAP (docs/reproducing.md, turn caps)
    max_turns_limit = 16
    #: the local corpus's retriever; :meth:`tool_services_for` picks the one of ``domainOptions.corpus``
    tool_services = (LOCAL_RETRIEVER,)
    options_model = SearchOptions

    def __init__(self, retriever: Retriever | None = None) -> None:
        """``retriever``: the retriever to use (tests, benchmarks); default resolved from the environment."""
        self._retriever = retriever
        self._corpus = "local"
        self._source = "sample"
        #: the benchmarks of the last test split loaded (what the eval notes report on)
        self._test_benchmarks: frozenset[str] | None = None
        self._lock = threading.Lock()
        #: domainOptions.searchAnswer: llmJudge scores with this judge (None: exact match, the default)
        self.judge: Judge | None = None

    def tool_services_for(self, data: Data) -> tuple[ToolService, ...]:
        from search_qa.data import resolve_corpus

        return (WIKI18_RETRIEVER,) if resolve_corpus(self.options.corpus) == "wiki18" else (LOCAL_RETRIEVER,)

    def cluster_options(self, options: Any) -> Any:
        """A cluster's corpus ``auto`` is the paper's wiki18 (docs/data.md#search_qa)."""
        return options.model_copy(update={"corpus": "wiki18"}) if options.corpus == "auto" else options

    @property
    def scores_with_judge(self) -> bool:
        return bool(self.options.search_answer == "llmJudge")

    def prepare_store(self, data: Data, store: Store) -> None:
        """Local corpus: copy the shipped passages into the store (the BM25 service indexes them).
        wiki18: download e5-base-v2 and Search-R1's wiki-18 corpus + flat e5 index, check the pair and
        publish the index folder (``COMPLETE`` last); skipped when the store has it."""
        from search_qa.data import corpus_path, resolve_corpus

        prefix = data_prefix(self.name)
        if resolve_corpus(self.options.corpus) == "local":
            key = f"{prefix}/{LOCAL_CORPUS_KEY}"
            if not store.exists(key):
                source = corpus_path(data_root(data))
                if not source.is_file():
                    raise DomainError(f"{source}: missing; the local corpus is copied from there into the store")
                store.upload_file(source, key)
            return
        from whale.domain import default_cache_dir, ensure_published_wiki18

        work = default_cache_dir() / "wiki18-e5"  # a retry in the same pod resumes the downloads
        if ensure_published_wiki18(store, f"{prefix}/{WIKI18_INDEX_KEY.rstrip('/')}", work):
            shutil.rmtree(work, ignore_errors=True)

    def full_data(self) -> FullData:
        from search_qa.full import FULL

        return FULL

    def build_splits(self, data: Data) -> dict[str, list[dict[str, Any]]]:
        from search_qa.data import load_splits, train_filter_for

        return load_splits(
            data_root(data),
            seed=data.seed,
            harness_size=data.harness_size,
            weight_size=data.weight_size,
            test_size=data.test_size,
            train=train_filter_for(self.options.corpus),
        )

    def load_split(self, split: str, data: Data, store: Store | None = None) -> list[dict[str, Any]]:
        """The split; also fixes the corpus this process's searches use, and, where a retriever service
        serves them (``$WHALE_RETRIEVER_URL``, a cluster's workloads), waits until it answers, so no
        episode starts against a retriever still loading its index."""
        from search_qa.data import resolve_corpus

        items = super().load_split(split, data, store)
        self._corpus = resolve_corpus(self.options.corpus)
        self._source = data.source
        if split == "test":
            self._test_benchmarks = frozenset(str(item.get("subset")) for item in items)
        if os.environ.get(RETRIEVER_URL_ENV):
            self.retriever()
        return items

    def notes(self) -> list[str]:
        """What the eval result should say about the test split: the paper's benchmarks it lacks (those of
        the last test split this process loaded; before any, none for the full data, else those the default
        data root lacks)."""
        from search_qa.data import BENCHMARKS, missing_benchmarks

        present = self._test_benchmarks
        if present is None and self._source == "full":  # the full data has all seven benchmarks
            return []
        missing = (
            missing_benchmarks(default_data_root())
            if present is None
            else tuple(b for b in BENCHMARKS if b not in present)
        )
        return [
            f"benchmark {b} is missing from the data; D_test uses the other {len(BENCHMARKS) - len(missing)} "
            f"of the paper's {len(BENCHMARKS)}"
            for b in missing
        ]

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
                from whale.domain import retriever_from_env

                corpus = None
                if self._corpus == "local":
                    corpus = Path(os.environ.get(CORPUS_ENV) or corpus_path(default_data_root()))
                self._retriever = retriever_from_env(corpus, os.environ.get(METHOD_ENV, "bm25"))
            return self._retriever

    def make_env(self, item: dict[str, Any]) -> SearchEnvironment:
        from search_qa.env import SearchEnvironment

        return SearchEnvironment(item, self.retriever, self.judge)

    def configure_verifier(self, verifier: Verifier) -> None:
        """``domainOptions.searchAnswer``: exactMatch (the default) or the LLM judge of ``spec.experiment.verifier.judge``,
        its key read from the variable ``judge.apiKeyEnv`` names."""
        if not self.scores_with_judge:
            self.judge = None
            return
        from search_qa.judge import Judge

        j = verifier.judge
        key = os.environ.get(j.api_key_env) if j.api_key_env else None
        if j.api_key_env and not key:
            raise DomainError(
                f"spec.experiment.verifier.judge.apiKeyEnv: ${j.api_key_env} is not set; set it to the judge's API key, or set "
                "apiKeyEnv: null for an endpoint without one, or use domainOptions.searchAnswer: exactMatch"
            )
        self.judge = Judge(base_url=j.base_url, model=j.model, api_key=key)

    def tool_specs(self) -> list[dict[str, Any]]:
        from search_qa.env import TOOL_SPEC

        return [TOOL_SPEC]

    def prototype_modules(self) -> dict[str, str]:
        """The search tool's answer (``search_qa.tool``, standard library only) as the kit runs it."""
        return {"search_qa/tool.py": (HERE / "tool.py").read_text("utf-8")}

    def subset(self, item: dict[str, Any]) -> str:
        return str(item.get("subset") or "train")

    def h0_path(self) -> Path:
        return HERE / "h0.py"

    def skill_path(self) -> Path:
        return HERE / "SKILL.md"

    def skill_text(self, data: Data) -> str:
        """SKILL.md with its D_harness sentence for ``data.source``: the sample's HotpotQA/2Wiki + NQ-open mix,
        or the full data's NQ training questions (``search_qa.full``)."""
        text = super().skill_text(data)
        if data.source == "full":
            text = text.replace(SAMPLE_HARNESS_TEXT, FULL_HARNESS_TEXT)
        return text


#: how SKILL.md describes D_harness (the sample's), and the full data's
SAMPLE_HARNESS_TEXT = "(HotpotQA/2Wiki and NQ-open training questions)"
FULL_HARNESS_TEXT = "(NQ training questions, as the paper's)"

DOMAIN = SearchQA()
