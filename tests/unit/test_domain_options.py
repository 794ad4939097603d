"""``spec.experiment.domainOptions``: the core passes a mapping, each domain validates it with its own model
(domains/<domain>/options.py); a bad field is refused naming ``spec.experiment.domainOptions.<field>`` and the fix,
by `whale validate` and by the operator."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from whale import plugins
from whale.cli import app
from whale.core.spec import WhaleRunSpec
from whale.domain import DomainOptionsError, for_run
from whale_operator.config import OperatorConfig, SpecError
from whale_operator.domains import DomainCatalog

ROOT = Path(__file__).resolve().parents[2]
cli = CliRunner()


def _manifest(tmp_path: Path, options: dict) -> Path:
    doc = yaml.safe_load((ROOT / "manifests/examples/math-rsft.yaml").read_text())
    doc["spec"]["experiment"]["domainOptions"] = options
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_whale_validate_names_a_bad_option_and_the_domains_options(tmp_path: Path):
    res = cli.invoke(app, ["validate", "--target", "cluster", str(_manifest(tmp_path, {"mathSett": "gsm8k"}))])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert (
        "spec.experiment.domainOptions.mathSett: not an option of domain 'math_reasoning'; its options: mathAnswer, "
        "mathSet" in res.output
    )
    res = cli.invoke(app, ["validate", "--target", "cluster", str(_manifest(tmp_path, {"mathSet": "aime2026"}))])
    assert res.exit_code == 1
    assert "spec.experiment.domainOptions.mathSet: Input should be 'aime' or 'gsm8k'" in res.output
    res = cli.invoke(app, ["validate", "--target", "cluster", str(_manifest(tmp_path, {"mathSet": "gsm8k"}))])
    assert res.exit_code == 0, res.output


def test_the_options_reach_a_copy_of_the_plugin_and_a_plugin_without_options_takes_none(counting_domain):
    shared = plugins.load("math_reasoning")
    gsm8k = for_run(shared, {"mathSet": "gsm8k", "mathAnswer": "mathVerify"})
    assert (gsm8k.options.math_set, gsm8k.answer_match) == ("gsm8k", "mathVerify")
    assert (shared.options.math_set, shared.answer_match) == ("aime", "dapo"), "the loaded plugin is shared"
    assert for_run(shared, {}) is shared
    counting = plugins.load(counting_domain)  # a plugin that is not a whale.domain.Domain
    assert for_run(counting, {}) is counting
    with pytest.raises(DomainOptionsError, match="domain 'counting' takes no options; remove domainOptions"):
        for_run(counting, {"x": 1})


def _spec(domain: str, **options: object) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": domain,
            "condition": "rsft_only",
            "experiment": {
                "model": {"name": "m"},
                "schedule": {"totalSteps": 2},
                "domainOptions": options,
                "verifier": {"judge": {"apiKeySecret": {"name": "judge", "key": "k"}}},
            },
            "execution": {"storage": {"uri": "s3://b", "endpoint": "minio:9000"}},
        }
    )


def test_the_operator_applies_the_cluster_defaults_and_gives_the_judges_key_only_where_it_scores():
    domains = DomainCatalog(OperatorConfig())
    spec, judged = domains.effective(_spec("search_qa"))
    assert spec.experiment.domain_options == {"corpus": "wiki18", "searchAnswer": "exactMatch"} and not judged
    assert spec.experiment.verifier.judge.api_key_secret is None, "exact match: no pod needs the judge's key"
    spec, judged = domains.effective(_spec("search_qa", searchAnswer="llmJudge", corpus="local"))
    assert judged and spec.experiment.domain_options["corpus"] == "local"
    assert spec.experiment.verifier.judge.api_key_secret is not None
    with pytest.raises(SpecError) as refused:
        domains.effective(_spec("chess_puzzles", chessMove="anyCheck"))
    assert refused.value.field == "spec.experiment.domainOptions.chessMove"
    assert "'stored' or 'anyMate'" in str(refused.value)
