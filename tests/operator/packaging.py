"""Rendering the install manifests as a cluster would get them: the kustomize overlays and the Helm chart.

Kustomize: ``kubectl kustomize`` (the kustomize built into kubectl) where kubectl is on the PATH; otherwise
:func:`render_kustomization`, a small renderer of the subset the overlays use (``resources`` files and
directories, inline JSON6902 ``patches`` with a ``target``, ``configMapGenerator`` from files without a name
hash). A test checks the two agree wherever kubectl is there, so the fallback stays honest.

Helm: Helm's own Go SDK through ``helm_python`` (the helm-python-sdk wheel bundles it as a shared library),
so the chart is rendered by the real template engine, not a re-implementation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
CHART = ROOT / "chart"
OVERLAYS = ("cluster", "namespaced", "dev")
KUBECTL_TIMEOUT_S = 60

Doc = dict[str, Any]


def key(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc.get("metadata", {})
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML reads YAML 1.1, where ``1e-07`` (no dot) is a string; kustomize writes YAML 1.2, where it is the
    float the API server reads. This loader resolves floats as 1.2 does."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                |\.[0-9_]+(?:[eE][-+][0-9]+)?
                |[-+]?\.(?:inf|Inf|INF)
                |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_all(text: str) -> list[Doc]:
    return [d for d in yaml.load_all(text, Loader=_Yaml12Loader) if d]


def kubectl() -> str | None:
    return shutil.which("kubectl")


def kustomize(path: Path) -> list[Doc]:
    """The objects ``kubectl apply -k path`` would send."""
    exe = kubectl()
    if exe is None:
        return render_kustomization(path)
    out = subprocess.run(
        [exe, "kustomize", str(path)], capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S, check=False
    )
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path}: {out.stderr.strip()}")
    return load_all(out.stdout)


def _matches(doc: Doc, target: dict[str, str]) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    wanted = {
        "group": group,
        "version": version,
        "kind": doc["kind"],
        "name": doc["metadata"]["name"],
        "namespace": doc["metadata"].get("namespace", ""),
    }
    return all(wanted[k] == v for k, v in target.items())


def render_kustomization(path: Path) -> list[Doc]:
    """The subset of kustomize the overlays use; anything else is refused, never ignored."""
    spec = yaml.safe_load((path / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "resources", "patches", "configMapGenerator", "generatorOptions"}
    unknown = set(spec) - known
    if unknown:
        raise NotImplementedError(f"{path}/kustomization.yaml: {sorted(unknown)} (use kubectl kustomize)")
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        target = (path / entry).resolve()
        docs += render_kustomization(target) if target.is_dir() else load_all(target.read_text())
    for gen in spec.get("configMapGenerator", []):
        data = {Path(f).name: (path / f).read_text() for f in gen.get("files", [])}
        meta: dict[str, Any] = {"name": gen["name"]}
        if "namespace" in gen:
            meta["namespace"] = gen["namespace"]
        options = {**spec.get("generatorOptions", {}), **gen.get("options", {})}
        if options.get("labels"):
            meta["labels"] = dict(options["labels"])
        if not options.get("disableNameSuffixHash"):
            raise NotImplementedError(f"{path}: a configMapGenerator with a name hash (use kubectl kustomize)")
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for patch in spec.get("patches", []):
        ops = jsonpatch.JsonPatch(yaml.safe_load(patch["patch"]))
        hits = [i for i, d in enumerate(docs) if _matches(d, patch["target"])]
        if not hits:
            raise AssertionError(f"{path}: a patch matches nothing: {patch['target']}")
        for i in hits:
            docs[i] = ops.apply(docs[i])
    return docs


def helm_render(
    values: dict[str, Any] | None = None, *, release: str = "whale", namespace: str = "whale-system"
) -> tuple[list[Doc], list[Doc]]:
    """(the chart's crds/, its rendered templates) for ``values`` over the chart's defaults."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values or {}, name=release, namespace=namespace)
    templates = [
        d for name, text in sorted(rendered.items()) if name.endswith((".yaml", ".yml")) for d in load_all(text)
    ]
    crds = [d for f in sorted((CHART / "crds").glob("*.yaml")) for d in load_all(f.read_text())]
    return crds, templates
