"""Hostile manifests, second round (issue 27): each was a traceback or was accepted silently.

Every case goes through the real `whale validate` (and, where the issue found it there, `whale plan` and
`whale run`): exit code 1 with a message naming the field and the fix, no traceback; what the CRD's schema can
say, the CRD says too. The store case reads a real folder store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.security.test_manifests import (
    BASE_SPEC,
    GOOD_YAML,
    NOT_IN_SCHEMA,
    SCHEMA,
    Case,
    cel_messages,
    cli,
    crd_errors,
    document,
    patched,
    spec_case,
    write_case,
)
from whale.cli import app
from whale.domain import default_data_root
from whale.store import StoreError, open_store


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


def replay(spec: dict[str, Any], script: str) -> dict[str, Any]:
    return {
        **spec,
        "condition": "mh_only",
        "schedule": {"mhOnlyIterations": 1},
        "harnessSearch": {"proposer": {"backend": "replay", "script": script}},
    }


def cli_proposer(read_paths: list[str]) -> dict[str, Any]:
    return {
        **BASE_SPEC,
        "harnessSearch": {
            "proposer": {
                "backend": "cli",
                "command": ["claude", "-p", "{prompt}"],
                "readPaths": read_paths,
                "apiKeySecret": {"name": "proposer", "key": "api-key"},
            }
        },
    }


CASES = [
    # --- YAML 1.1 vs 1.2: read differently by different tools
    Case(
        "sexagesimal",
        GOOD_YAML.replace("totalSteps: 10", "totalSteps: 1:30").encode(),
        "'1:30' at line",
        crd=NOT_IN_SCHEMA,
    ),
    Case(
        "octal-looking", GOOD_YAML.replace("totalSteps: 10", "totalSteps: 010").encode(), "'010' at line", NOT_IN_SCHEMA
    ),
    Case("yaml11-bool", (GOOD_YAML + "  suspend: yes\n").encode(), "'yes' at line", crd=NOT_IN_SCHEMA),
    Case("underscore-number", GOOD_YAML.replace("totalSteps: 10", "totalSteps: 1_0").encode(), "'1_0'", NOT_IN_SCHEMA),
    # --- sizes and paths that reached the file system
    spec_case(
        "model-name-900kb", "model.name", "x" * 900_000, "spec.experiment.model.name: String should have at most 4096"
    ),
    spec_case(
        "gguf-escape",
        "model.ggufFile",
        "../../../../etc/shadow",
        "spec.experiment.model.ggufFile: must be a path inside",
    ),
    spec_case("gguf-absolute", "model.ggufFile", "/etc/shadow", "spec.experiment.model.ggufFile"),
    spec_case("gguf-home", "model.ggufFile", "~/.ssh/id_rsa", "spec.experiment.model.ggufFile"),
    # --- walls lifted without saying so
    Case(
        "isolation-none-unacknowledged",
        document(patched("sandbox.isolation", "none")),
        "set sandbox.acknowledgeUnisolated: true",
        crd="cel:sandbox.isolation: none runs harness files",
    ),
    Case(
        "integrity-off-unacknowledged",
        document(patched("harnessSearch.integrity", {"action": "off"})),
        "set harnessSearch.integrity.acknowledgeOff: true",
        crd="cel:harnessSearch.integrity.action: off lifts",
    ),
    # --- credentials where a Secret belongs
    spec_case(
        "inference-url-credentials",
        "inference.baseUrl",
        "http://user:pw@vllm:8000/v1",
        "spec.execution.inference.baseUrl",
    ),
    spec_case("store-uri-credentials", "storage.uri", "s3://AKIAXX:secret@bucket/runs", "no credentials in it"),
    spec_case(
        "store-endpoint-credentials", "storage.endpoint", "key:secret@minio:9000", "spec.execution.storage.endpoint"
    ),
    spec_case(
        "proposer-url-credentials",
        "harnessSearch.proposer.baseUrl",
        "https://u:sk-123@api.example.com/v1",
        "spec.experiment.harnessSearch.proposer.baseUrl",
    ),
    Case(
        "source-url-credentials",
        document(
            {
                **BASE_SPEC,
                "data": {"source": "full", "sources": [{"name": "x", "url": "https://u:p@host/file.csv"}]},
            }
        ),
        "no credentials in it",
    ),
    # --- newlines in what becomes a pod or a label
    spec_case("image-newline", "cluster.images.worker", "evil\nimage:1", "spec.cluster.images.worker"),
    spec_case("image-space", "cluster.images.vllm", "vllm/vllm-openai v1", "spec.cluster.images.vllm"),
    Case(
        "metadata-label-newline",
        {**document(), "metadata": {"name": "run-1", "labels": {"team": "a\nb"}}},
        "metadata.labels.team",
        crd="metadata.labels is the API server's own check (ObjectMeta), not the CRD schema's",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_whale_validate_refuses_with_a_clear_message(tmp_path: Path, case: Case) -> None:
    path = write_case(tmp_path, case)
    res = cli.invoke(app, ["validate", str(path)])
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert case.expect in res.output, res.output
    assert "Traceback" not in res.output and len(res.output) < 8_000


@pytest.mark.parametrize("case", [c for c in CASES if isinstance(c.content, dict)], ids=lambda c: c.id)
def test_the_crd_refuses_what_its_schema_can_express(case: Case) -> None:
    assert isinstance(case.content, dict)
    if case.crd == "reject":
        assert crd_errors(case.content), "the CRD schema accepts what `whale validate` refuses"
    elif case.crd.startswith("cel:"):
        assert case.crd.removeprefix("cel:") in " ".join(cel_messages(SCHEMA))
    else:
        pytest.skip(case.crd)


def test_quoted_and_plain_values_still_load(tmp_path: Path) -> None:
    """The control: the same values quoted, or written the one way every YAML reads them, are fine."""
    text = GOOD_YAML.replace("totalSteps: 10", "totalSteps: 90") + "  execution:\n    suspend: false\n"
    text = text.replace("name: tiny", "name: '010'")
    path = tmp_path / "ok.yaml"
    path.write_text(text)
    res = cli.invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output


# ----- no traceback where a path reaches the file system ------------------------------------------------


def _write(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(document(spec), width=10**7))
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_path_component_too_long_for_the_file_system_is_named(tmp_path: Path, command: str) -> None:
    spec = {**BASE_SPEC, "model": {"name": "./" + "a" * 300 + "/model"}, "inference": {"backend": "transformers"}}
    args = [command, str(_write(tmp_path, spec))]
    if command == "run":
        args += ["--store", str(tmp_path / "store"), "--workdir", str(tmp_path / "work")]
    res = cli.invoke(app, args)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "spec.experiment.model.name: cannot check the path" in res.output and "File name too long" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_deeply_nested_replay_script_is_named(tmp_path: Path, command: str) -> None:
    script = tmp_path / "deep.json"
    script.write_text("[" * 100_000 + "]" * 100_000)
    args = [command, str(_write(tmp_path, replay(BASE_SPEC, str(script))))]
    if command == "run":
        args += ["--store", str(tmp_path / "store"), "--workdir", str(tmp_path / "work")]
    res = cli.invoke(app, args)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "spec.experiment.harnessSearch.proposer.script" in res.output and "nested too deeply" in res.output


def test_a_long_script_name_is_named(tmp_path: Path) -> None:
    res = cli.invoke(app, ["validate", str(_write(tmp_path, replay(BASE_SPEC, "b" * 300 + ".json")))])
    assert res.exit_code == 1 and "spec.experiment.harnessSearch.proposer.script: cannot check the path" in res.output


# ----- a cli proposer's readPaths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "expect"),
    [
        (lambda tmp: str(default_data_root()), "would show the untrusted agent"),
        (lambda tmp: str(Path.home()), "would show the untrusted agent"),
        (lambda tmp: str(Path.home() / ".ssh"), ".ssh"),
        (lambda tmp: "/etc", "/etc"),
        (lambda tmp: str(Path(__file__).resolve().parents[2]), "would show the untrusted agent"),
    ],
    ids=["data-root", "home", "ssh", "etc", "checkout"],
)
def test_read_paths_never_show_the_agent_data_homes_or_credentials(tmp_path: Path, where: Any, expect: str) -> None:
    path = _write(tmp_path, cli_proposer([where(tmp_path)]))
    res = cli.invoke(app, ["validate", "--target", "local", str(path)])
    assert res.exit_code == 1, res.output
    assert "spec.experiment.harnessSearch.proposer.readPaths[0]" in res.output and expect in res.output, res.output


def test_an_agent_install_is_a_fine_read_path(tmp_path: Path) -> None:
    install = tmp_path / "opt" / "claude-code"
    install.mkdir(parents=True)
    res = cli.invoke(app, ["validate", "--target", "local", str(_write(tmp_path, cli_proposer([str(install)])))])
    assert "readPaths" not in res.output, res.output


# ----- acknowledged walls are warned about, on validate, plan and run -----------------------------------


def test_acknowledged_settings_warn_on_validate_plan_and_run(tmp_path: Path) -> None:
    spec = {
        **BASE_SPEC,
        "sandbox": {"isolation": "none", "acknowledgeUnisolated": True},
        "harnessSearch": {
            **BASE_SPEC["harnessSearch"],
            "integrity": {"action": "off", "acknowledgeOff": True},
        },
    }
    path = _write(tmp_path, spec)
    for args in (
        ["validate", str(path)],
        ["plan", str(path), "-o", "json"],
        ["run", str(path), "--store", str(tmp_path / "store"), "--workdir", str(tmp_path / "w"), "--timeout", "0.5"],
    ):
        res = cli.invoke(app, args)
        assert "warning: spec.execution.sandbox.isolation: none (acknowledged)" in res.output, (args[0], res.output)
        assert "warning: spec.experiment.harnessSearch.integrity.action: off (acknowledged)" in res.output, args[0]
        assert "Traceback" not in res.output


def test_a_budget_cut_by_max_cycles_says_so_and_is_priced_as_cut(tmp_path: Path) -> None:
    spec = {
        **BASE_SPEC,
        "schedule": {"totalSteps": 1_000_000, "weightStepsPerCycle": 4, "harnessIterationsPerCycle": 2},
        "evaluation": {"intervalSteps": 100_000, "atStart": False},
    }
    path = _write(tmp_path, spec)
    res = cli.invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output
    assert "warning: schedule.maxCycles (30) ends the run after 30 cycles, at step 120 of the 1,000,000" in res.output
    res = cli.invoke(app, ["plan", str(path), "-o", "json"])
    plan = json.loads(res.stdout)
    assert plan["totalSteps"] == 120 and plan["requestedTotalSteps"] == 1_000_000
    assert "schedule.maxCycles" in plan["warnings"][0]


# ----- store reads name the object ----------------------------------------------------------------------


def test_a_store_object_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    store.write_bytes("runs/r/phases/p/result.json", b'{"a": "\xff"}')
    store.write_bytes("runs/r/phases/p/metrics.jsonl", b'{"a": 1}\n{"b": "\xfe"}\n')
    store.write_bytes("runs/r/harnesses/h.py", b"x = '\xff'\n")
    for read, key in (
        (store.read_json, "runs/r/phases/p/result.json"),
        (store.read_jsonl, "runs/r/phases/p/metrics.jsonl"),
        (store.read_text, "runs/r/harnesses/h.py"),
    ):
        with pytest.raises(StoreError) as info:
            read(key)
        assert store.uri_for(key) in str(info.value) and "not UTF-8" in str(info.value)
    store.write_bytes("runs/r/deep.json", b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(StoreError, match="nested too deeply"):
        store.read_json("runs/r/deep.json")
