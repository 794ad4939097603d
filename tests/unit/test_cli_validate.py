"""`whale validate` catches what used to fail an hour into a run — a missing local model folder, replay script
or data root — naming the field; `whale run` refuses on the same checks before any phase starts. Also the
command line's own manners: `whale -h`, `whale --version`."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.http_double import DoubleHTTPServer
from whale.cli import app
from whale.core.convert import convert_v1alpha1

cli = CliRunner()
BASE = {
    "domain": "counting",
    "condition": "whale",
    "model": {"name": "tiny"},
    "schedule": {"totalSteps": 4, "weightStepsPerCycle": 2, "harnessIterationsPerCycle": 2},
    # a proposer that can run (a keyless local endpoint), so only the problems under test are reported
    "harnessSearch": {"proposer": {"model": "m", "baseUrl": "http://127.0.0.1:8000/v1"}},
}


@pytest.fixture(autouse=True)
def _plugin(counting_domain, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WHALE_DATA_DIR", raising=False)
    monkeypatch.delenv("WHALE_INFERENCE_URL", raising=False)
    return counting_domain


def write(tmp_path: Path, namespace: str | None = None, **spec) -> Path:
    meta = {"name": "tiny", **({"namespace": namespace} if namespace else {})}
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            convert_v1alpha1(
                {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": meta, "spec": {**BASE, **spec}}
            )
        )
    )
    return path


def validate(path: Path, *extra: str):
    return cli.invoke(app, ["validate", str(path), *extra])


def test_a_missing_local_model_folder_is_named_before_anything_runs(tmp_path):
    res = validate(write(tmp_path, model={"name": "./models/tiny"}))
    assert res.exit_code == 1
    assert (
        f"spec.experiment.model.name: ./models/tiny does not exist (relative paths are from the current folder, {tmp_path})"
        in res.output
    )
    # the same check stops `whale run` before it writes anything
    res = cli.invoke(app, ["run", str(tmp_path / "tiny.yaml"), "--store", "st"])
    assert res.exit_code == 1 and "spec.experiment.model.name: ./models/tiny does not exist" in res.output
    assert not (tmp_path / "st").exists()

    (tmp_path / "models" / "tiny").mkdir(parents=True)
    res = validate(tmp_path / "tiny.yaml")
    assert res.exit_code == 1 and "is not a model folder (no config.json in it)" in res.output
    (tmp_path / "models" / "tiny" / "config.json").write_text("{}")
    assert validate(tmp_path / "tiny.yaml").exit_code == 0

    res = validate(write(tmp_path, model={"name": "./models/tiny", "ggufFile": "m.gguf"}))
    assert (
        res.exit_code == 1
        and f"spec.experiment.model.ggufFile: {tmp_path}/models/tiny/m.gguf does not exist" in res.output
    )


def fake_hf_cache(root: Path, model: str, files: tuple[str, ...] = ("config.json",)) -> Path:
    """A Hugging Face cache folder as huggingface_hub lays it out: refs/main -> a snapshot holding ``files``."""
    repo = root / f"models--{model.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    for name in files:
        path = repo / "snapshots" / "0123abcd" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    return root


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: a Hub that is unreachable at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stand_in_hub() -> Iterator[str]:
    """A stand-in for the Hub's model API on loopback (a real HTTP server; the real Hub is not reachable from
    CI): it has org/present, and nothing else."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/api/models/org/present" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = DoubleHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_model_id_is_found_in_the_local_cache_or_on_the_hub_or_refused(tmp_path, monkeypatch, closed_port):
    cache = fake_hf_cache(tmp_path / "hf", "Qwen/Qwen3-0.6B")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    res = validate(write(tmp_path, model={"name": "Qwen/Qwen3-0.6B"}))
    assert res.exit_code == 0, res.output
    assert (
        f"note: model Qwen/Qwen3-0.6B: in the local Hugging Face cache ({cache}/models--Qwen--Qwen3-0.6B" in res.output
    )
    # not cached, and the Hub unreachable: refused, by validate and by run, before anything is written
    res = validate(write(tmp_path, model={"name": "Qwen/Qwen3-1.7B"}))
    assert res.exit_code == 1
    assert "spec.experiment.model.name: Qwen/Qwen3-1.7B is not in the local Hugging Face cache and" in res.output
    assert (
        f"http://127.0.0.1:{closed_port} is unreachable" in res.output and "hf download Qwen/Qwen3-1.7B" in res.output
    )
    res = cli.invoke(app, ["run", str(tmp_path / "tiny.yaml"), "--store", "st"])
    assert res.exit_code == 1 and "is not in the local Hugging Face cache" in res.output
    assert not (tmp_path / "st").exists()
    # offline by setting: not even asked
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE is set" in validate(tmp_path / "tiny.yaml").output
    # for a cluster the pods load it: not probed from here
    res = validate(write(tmp_path, namespace="whale", model={"name": "Qwen/Qwen3-1.7B"}))
    assert res.exit_code == 0 and "unreachable" not in res.output and "model Qwen/Qwen3-1.7B:" not in res.output


def test_a_model_id_the_hub_answers_for(tmp_path, monkeypatch, stand_in_hub):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_ENDPOINT", stand_in_hub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    res = validate(write(tmp_path, model={"name": "org/present"}))
    assert res.exit_code == 0, res.output
    assert f"note: model org/present: not cached; {stand_in_hub} has it, the first phase downloads it" in res.output
    res = validate(write(tmp_path, model={"name": "org/misspelt"}))
    assert res.exit_code == 1 and "/api/models/org/misspelt answered HTTP 404 (no such model to read)" in res.output
    assert "check the id (org/name), set HF_TOKEN" in res.output


def test_model_ids_and_models_only_a_server_loads_are_not_checked_here(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(fake_hf_cache(tmp_path / "hf", "Qwen/Qwen3-0.6B")))
    assert validate(write(tmp_path, model={"name": "Qwen/Qwen3-0.6B"})).exit_code == 0  # a cached Hugging Face id
    assert validate(write(tmp_path, model={"name": "tiny"})).exit_code == 0  # no organisation: a legacy id, unchecked
    served = write(
        tmp_path,
        condition="mh_only",
        model={"name": "/models/on/the/server"},
        inference={"backend": "openai", "baseUrl": "http://127.0.0.1:9/v1"},
        schedule={"mhOnlyIterations": 2},
    )
    assert validate(served).exit_code == 0, "an OpenAI-compatible server loads it, not this machine"
    res = validate(write(tmp_path, model={"name": "/models/on/the/server"}))
    assert res.exit_code == 1 and "spec.experiment.model.name: /models/on/the/server does not exist" in res.output


def test_the_replay_script_and_the_files_it_names_must_be_there(tmp_path):
    proposer = {"backend": "replay", "script": "replay/proposals.json"}
    res = validate(write(tmp_path, harnessSearch={"proposer": proposer}))
    assert res.exit_code == 1
    assert "spec.experiment.harnessSearch.proposer.script: replay/proposals.json does not exist" in res.output
    assert (
        validate(
            write(tmp_path, condition="rsft_only", schedule={"totalSteps": 4}, harnessSearch={"proposer": proposer})
        ).exit_code
        == 0
    ), "a run without harness phases never reads it"
    (tmp_path / "replay").mkdir()
    script = tmp_path / "replay" / "proposals.json"
    script.write_text("{not json")
    res = validate(write(tmp_path, harnessSearch={"proposer": proposer}))
    assert res.exit_code == 1 and "spec.experiment.harnessSearch.proposer.script: cannot read" in res.output
    script.write_text(json.dumps({"iterations": {"2": [{"name": "a", "file": "a.py"}, {"name": "b", "code": "x"}]}}))
    res = validate(tmp_path / "tiny.yaml")
    assert res.exit_code == 1
    assert "iteration 2 candidate 1 names file a.py, which does not exist" in res.output
    (tmp_path / "replay" / "a.py").write_text("# a candidate\n")
    assert validate(tmp_path / "tiny.yaml").exit_code == 0


def test_a_data_root_that_is_named_must_be_a_readable_folder(tmp_path, monkeypatch):
    res = validate(write(tmp_path, data={"dataDir": "/nonexistent/data"}))
    assert res.exit_code == 1
    assert "spec.experiment.data.dataDir: /nonexistent/data is not a folder on this machine" in res.output
    monkeypatch.setenv("WHALE_DATA_DIR", str(tmp_path / "nodata"))
    res = validate(write(tmp_path))
    assert res.exit_code == 1 and "spec.experiment.data.dataDir (unset; $WHALE_DATA_DIR)" in res.output
    (tmp_path / "nodata").mkdir()
    assert validate(tmp_path / "tiny.yaml").exit_code == 0


def test_a_manifest_for_a_cluster_gets_the_local_checks_as_notes(tmp_path):
    """Paths in a manifest meant for `kubectl apply` are the image's: noted, not refused, unless asked to."""
    path = write(tmp_path, namespace="whale", model={"name": "/opt/whale/models/tiny"})
    res = validate(path)
    assert res.exit_code == 0, res.output
    assert res.output.startswith("ok: WhaleRun tiny")
    assert (
        "note: not on this machine, so `whale run` would refuse it here: spec.experiment.model.name: /opt/whale/models/tiny"
        in res.output
    )
    assert validate(path, "--target", "local").exit_code == 1
    res = validate(write(tmp_path, model={"name": "/opt/whale/models/tiny"}), "--target", "cluster")
    assert res.exit_code == 0 and "note: not on this machine" in res.output


def test_every_problem_is_listed_at_once(tmp_path):
    res = validate(
        write(
            tmp_path,
            model={"name": "./nomodel"},
            data={"dataDir": "./nodata"},
            harnessSearch={"proposer": {"backend": "replay", "script": "noscript.json"}},
        )
    )
    assert res.exit_code == 1 and "3 problem(s)" in res.output
    assert "Traceback" not in res.output


def test_short_help_and_version():
    res = cli.invoke(app, ["-h"])
    assert res.exit_code == 0
    for command in ("validate", "plan", "run", "list", "status", "logs", "stop", "report", "domains"):
        assert command in res.output
    res = cli.invoke(app, ["run", "-h"])
    assert res.exit_code == 0 and "--retry" in res.output
    res = cli.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"whale {metadata.version('whale-k8s')}"
    out = subprocess.run([sys.executable, "-m", "whale.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("whale ")


def test_the_demo_manifest_needs_its_model_built_first(tmp_path):
    """`make demo` builds the model, then validates: in a fresh checkout validate names the missing folder."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "manifests").symlink_to(root / "manifests")
    demo = "manifests/examples/local/tiny-synthetic-whale.yaml"
    res = cli.invoke(app, ["validate", demo])
    assert (
        res.exit_code == 1 and "spec.experiment.model.name: .whale/models/synthetic-tiny does not exist" in res.output
    )
    model = tmp_path / ".whale" / "models" / "synthetic-tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    res = cli.invoke(app, ["validate", demo])
    assert res.exit_code == 0 and res.output.startswith("ok: WhaleRun tiny-synthetic-whale"), res.output


QWEN35_CONFIG = {  # Qwen3.5's checkpoints are multimodal: the language model's config is text_config
    "model_type": "qwen3_5",
    "text_config": {"model_type": "qwen3_5_text", "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
}
SLIDING_CONFIG = {"model_type": "qwen3", "layer_types": ["sliding_attention", "full_attention"]}
OTHER_LINEAR_CONFIG = {"model_type": "qwen3_next", "layer_types": ["linear_attention"] * 3 + ["full_attention"]}


def model_folder(tmp_path: Path, config: dict, name: str = "m") -> str:
    folder = tmp_path / "models" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return f"./models/{name}"


@pytest.mark.parametrize("config", [SLIDING_CONFIG, OTHER_LINEAR_CONFIG])
def test_packing_a_model_whose_layers_would_leak_is_refused_with_the_setting_that_works(tmp_path, config):
    name = model_folder(tmp_path, config)
    res = validate(write(tmp_path, model={"name": name}, rsft={"packSequences": True}))
    assert res.exit_code == 1, res.output
    assert (
        "spec.experiment.rsft.packSequences: this model" in res.output and "set rsft.packSequences: false" in res.output
    )
    # the same refusal stops `whale run` before it writes anything, and holds for a cluster manifest too
    res = cli.invoke(app, ["run", str(tmp_path / "tiny.yaml"), "--store", "st"])
    assert res.exit_code == 1 and "spec.experiment.rsft.packSequences" in res.output and not (tmp_path / "st").exists()
    cluster = write(tmp_path, namespace="whale", model={"name": name}, rsft={"packSequences": True})
    assert validate(cluster, "--target", "cluster").exit_code == 1
    # the setting that works: padded micro-batches
    res = validate(write(tmp_path, model={"name": name}, rsft={"packSequences": False}))
    assert res.exit_code == 0, res.output


def test_a_hybrid_qwen35_packs_and_the_architecture_is_named(tmp_path):
    name = model_folder(tmp_path, QWEN35_CONFIG)
    res = validate(write(tmp_path, model={"name": name}, rsft={"packSequences": True}))
    assert res.exit_code == 0, res.output
    assert "note: model architecture: qwen3_5_text: 3 of 4 layers linear attention (hybrid)" in res.output


def test_the_architecture_is_read_from_the_hugging_face_cache_or_said_unchecked(tmp_path, monkeypatch, closed_port):
    cache = fake_hf_cache(tmp_path / "hf", "Qwen/Qwen3.5-2B")
    config = next(cache.glob("models--Qwen--Qwen3.5-2B/snapshots/*/config.json"))
    config.write_text(json.dumps(SLIDING_CONFIG))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    cluster = {"namespace": "whale", "model": {"name": "Qwen/Qwen3.5-2B"}, "rsft": {"packSequences": True}}
    res = validate(write(tmp_path, **cluster))
    assert res.exit_code == 1 and "sliding_attention layers" in res.output
    config.write_text(json.dumps(QWEN35_CONFIG))
    res = validate(write(tmp_path, **cluster))
    assert res.exit_code == 0 and f"3 of 4 layers linear attention (hybrid) ({config})" in res.output
    # not cached (a cluster's pods download it): said so, and left to the train workload's own check
    res = validate(write(tmp_path, **{**cluster, "model": {"name": "Qwen/Qwen3.5-4B"}}))
    assert res.exit_code == 0, res.output
    assert "note: model architecture not checked: Qwen/Qwen3.5-4B's config.json is not in the local" in res.output
    assert "the train workload checks it before loading weights" in res.output
