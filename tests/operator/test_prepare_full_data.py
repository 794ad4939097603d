"""An operator that may compute split sizes itself still leaves full data to the prepare Job: the data
must be fetched into the store before any workload reads it."""

from __future__ import annotations

from whale.store import open_store
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.config import OperatorConfig
from whale_operator.domains import DomainCatalog


def spec(source: str) -> ClusterRunSpec:
    return ClusterRunSpec.model_validate(
        {
            "domain": "synthetic" if source == "sample" else "chess_puzzles",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 4},
            "data": {"source": source},
        }
    )


def test_full_data_is_never_sized_by_the_operator(tmp_path):
    domains = DomainCatalog(OperatorConfig(domain_split_sizes=True))
    store = open_store(str(tmp_path / "st"))
    assert domains.split_sizes(store, "full-run", spec("full")) is None  # -> the prepare Job runs
    sized = domains.split_sizes(store, "sample-run", spec("sample"))
    assert sized is not None and sized["harness"] > 0  # sized in the operator
