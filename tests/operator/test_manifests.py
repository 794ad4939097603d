"""Every manifest under manifests/ validates; examples are valid WhaleRuns; every image is ours or pinned."""

from __future__ import annotations

import functools
import re
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from whale import plugins
from whale.core.protocol import EvalPhaseArgs, HarnessPhaseArgs, WeightPhaseArgs, phase_request
from whale_operator import builders
from whale_operator.cluster_spec import ClusterRunSpec, Images

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
CRDS = ROOT / "chart" / "crds"
EXAMPLES = sorted((MANIFESTS / "examples").glob("*.yaml"))
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
OUR_REGISTRY = "ghcr.io/whale-dev/whale-"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@functools.cache
def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


def with_built_in_proposer(wire: dict[str, Any]) -> dict[str, Any]:
    """``wire`` with a ``cli`` proposer (the examples' Claude Code, which needs an admin's sandbox-host opt-in on a
    cluster: docs/security.md) swapped for the built-in agent on the same model and key, so the rest of the run
    renders as it does where no namespace opted in."""
    search = wire.get("harnessSearch", {})
    proposer = search.get("proposer", {})
    if proposer.get("backend") != "cli":
        return wire
    built_in = {
        "backend": "openai",
        "model": proposer.get("model", "claude-opus-4-7"),
        "baseUrl": "https://api.anthropic.com/v1/",
        "apiKeySecret": {"name": "whale-proposer", "key": "api-key"},
        "timeoutSeconds": proposer.get("timeoutSeconds", 2400),
    }
    return {**wire, "harnessSearch": {**search, "proposer": built_in}}


def all_docs() -> list[tuple[Path, dict[str, Any]]]:
    """Every object under manifests/ and the CRDs (chart/crds, their one copy)."""
    files = [*sorted(MANIFESTS.rglob("*.yaml")), *sorted(CRDS.glob("*.yaml"))]
    return [(p, d) for p in files if p.name != "kustomization.yaml" for d in docs(p)]


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for _, d in all_docs():
        if d["kind"] == "CustomResourceDefinition":
            for v in d["spec"]["versions"]:
                out[(f"{d['spec']['group']}/{v['name']}", d["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


@functools.cache
def validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(crd_schemas()[(api_version, kind)])


@pytest.mark.parametrize("path, doc", all_docs(), ids=lambda x: x.name if isinstance(x, Path) else x["kind"])
def test_manifest_validates(path: Path, doc: dict[str, Any]):
    """Built-in kinds against the Kubernetes schemas (strict); custom kinds against our CRDs."""
    custom = crd_schemas().get((doc["apiVersion"], doc["kind"]))
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        pytest.skip("the Prometheus Operator's kinds: tests/operator/test_packaging.py checks them")
    if custom is not None:
        validator(doc["apiVersion"], doc["kind"]).validate(doc)  # OpenAPI 3.0 = draft 4 bounds
    else:
        kubernetes_validate.validate(doc, latest_version(), strict=True)


def test_kustomizations_install_everything_but_the_examples():
    """Every manifest file is listed by the kustomization beside it (crd, base, overlays/*, monitoring)."""
    listed = {
        (k.parent / r).resolve()
        for k in MANIFESTS.rglob("kustomization.yaml")
        for r in yaml.safe_load(k.read_text()).get("resources", [])
    }
    present = {
        p.resolve() for p in MANIFESTS.rglob("*.yaml") if p.name != "kustomization.yaml" and "examples" not in p.parts
    }
    assert present == {p for p in listed if p.is_file()}


def test_examples_are_the_papers_twelve_runs_plus_a_tiny_cpu_run():
    specs = {p.stem: ClusterRunSpec.model_validate(docs(p)[0]["spec"]) for p in EXAMPLES}
    grid = Counter((s.domain, s.condition.value) for n, s in specs.items() if n != "tiny-cpu")
    assert grid == Counter(
        {
            (d, c): 1
            for d in ("search_qa", "math_reasoning", "chess_puzzles")
            for c in ("rsft_only", "mh_only", "whale", "adaptive_whale")
        }
    )
    assert (
        specs["chess-whale"].experiment.model.name == "Qwen/Qwen3.5-4B"
        and specs["math-whale"].experiment.model.name == "Qwen/Qwen3.5-2B"
    )
    # budgets in steps (6 x 70, 4 x 74, 0.6 x 74): tests/unit/test_examples_budgets.py pins every one
    assert (
        specs["math-whale"].experiment.schedule.total_steps == 420
        and specs["searchqa-rsft"].experiment.schedule.total_steps == 296
    )
    assert specs["searchqa-whale"].experiment.schedule.weight_steps_per_cycle == 44
    assert specs["searchqa-whale"].experiment.schedule.harness_iterations_per_cycle == 6
    assert specs["math-mh"].experiment.schedule.mh_only_iterations == 60
    chess = specs["chess-rsft"].experiment.rsft.sampling  # the paper's 8129 assistant tokens inside a 16384 window
    assert (chess.max_response_tokens, chess.episode_token_budget, chess.episode_window_tokens) == (8129, 8129, 16384)
    assert (
        specs["tiny-cpu"].execution.inference.backend == "transformers"
        and specs["tiny-cpu"].execution.train.gpus_per_node == 0
    )
    for name in specs:
        assert docs(MANIFESTS / "examples" / f"{name}.yaml")[0]["metadata"]["name"] == name


def children_of(spec: ClusterRunSpec) -> list[dict[str, Any]]:
    run = builders.RunRef("example", "whale", "uid")
    store = spec.execution.storage.uri or "s3://whale"
    wire = spec.to_wire()
    reqs = [
        phase_request(
            wire,
            run="example",
            phase="c01-weight",
            attempt=1,
            args=WeightPhaseArgs(
                cycle=1,
                harness=None,
                from_checkpoint=None,
                from_step=0,
                target_step=2,
                steps_per_epoch=4,
                total_steps=2,
            ),
        ),
        phase_request(
            wire,
            run="example",
            phase="c01-harness",
            attempt=1,
            args=HarnessPhaseArgs(
                cycle=1,
                incoming_harness=None,
                checkpoint=None,
                step=0,
                iterations=2,
                archive="runs/example/archive/c01",
            ),
        ),
        phase_request(
            wire,
            run="example",
            phase="eval-c00-s000000-start",
            attempt=1,
            args=EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None),
        ),
    ]
    tools = plugins.load(spec.domain).tool_services
    out = [builders.job(run, spec, r, store_uri=store, tools=tools) for r in reqs]
    out += builders.tool_children(run, spec, tools, store_uri=store)
    out += builders.harness_children(run, spec)
    out.append(builders.auth_secret(run, {builders.AUTH_HARNESS_TOKEN: "t", builders.AUTH_VLLM_API_KEY: "k"}))
    out.append(builders.prepare_job(run, spec, 1, store_uri=store))
    out += [
        builders.inference_deployment(run, spec, store_uri=store),
        builders.inference_service(run, spec),
        *builders.served_doorbell(run, spec),
    ]
    multi = spec.with_sections(**{"train": spec.execution.train.model_copy(update={"num_nodes": 2})})
    rendezvous = builders.rendezvous_service(run, multi, reqs[0])
    assert rendezvous is not None  # two nodes
    out += [builders.job(run, multi, reqs[0], store_uri=store), rendezvous]
    out.append(builders.inference_network_policy(run))
    return out


def weight_request(spec: ClusterRunSpec) -> Any:
    """The first weight phase's request of the example run (steps 0 to 2)."""
    return phase_request(
        spec.to_wire(),
        run="example",
        phase="c01-weight",
        attempt=1,
        args=WeightPhaseArgs(
            cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=2, steps_per_epoch=4, total_steps=2
        ),
    )


def colocated_children_of(spec: ClusterRunSpec) -> list[dict[str, Any]]:
    """What a colocated weight phase adds: the train Job with vLLM beside the trainer, and its GPU claim."""
    run = builders.RunRef("example", "whale", "uid")
    req = weight_request(spec)
    store = spec.execution.storage.uri or "s3://whale"
    return [
        builders.colocated_gpu_claim_template(run, spec, req),
        builders.colocated_train_job(run, spec, req, store_uri=store),
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_children_built_from_each_example_validate(path: Path):
    spec = ClusterRunSpec.model_validate(docs(path)[0]["spec"])
    for child in children_of(spec):
        kubernetes_validate.validate(child, latest_version(), strict=True)


def images_named() -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "image" and isinstance(v, str):
                    found.add(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for _, d in all_docs():
        walk(d)
    for p in EXAMPLES:
        walk([c for c in children_of(ClusterRunSpec.model_validate(docs(p)[0]["spec"]))])
    defaults = Images()
    found |= {defaults.worker, defaults.vllm, defaults.tools}
    return found


def test_every_image_is_built_here_or_pinned_upstream():
    images = images_named()
    assert {"ghcr.io/whale-dev/whale-operator:" + VERSION, "vllm/vllm-openai:v0.24.0"} <= images
    for image in sorted(images):
        name, _, tag = image.rpartition(":")
        if image.startswith(OUR_REGISTRY):
            component = name[len(OUR_REGISTRY) :]
            assert (ROOT / "images" / component / "Dockerfile").is_file(), f"{image}: no images/{component}/Dockerfile"
            assert tag == VERSION, f"{image}: our images are tagged with the package version {VERSION}"
        else:
            assert "@sha256:" in image or (tag and tag != "latest" and re.search(r"\d", tag)), (
                f"{image}: upstream images must be pinned to a version tag or digest"
            )


def test_dockerfiles_pin_their_base_images():
    for dockerfile in sorted((ROOT / "images").glob("*/Dockerfile")):
        bases = re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), flags=re.M)
        assert bases, dockerfile
        for base in bases:
            assert ":" in base and not base.endswith(":latest") and re.search(r":\S*\d", base), f"{dockerfile}: {base}"
