"""Codemod: code and docs written against the flat v1alpha1 spec, rewritten for v1alpha2's owners.

v1alpha2 (whale.core.spec) moved each top-level section of ``spec`` under ``experiment`` or ``execution``
(whale.core.convert has the one table) and the status types to whale.core.status. This script rewrites:

- attribute paths on a spec: ``spec.rsft.x`` -> ``spec.experiment.rsft.x``, ``m.spec.storage`` ->
  ``m.spec.execution.storage``, also the wire spelling in strings and docs (``spec.harnessSearch.proposer``);
- ``spec.model_copy(update={"train": ...})`` -> ``spec.with_sections(**{"train": ...})`` (a section is replaced
  wherever it lives);
- ``from whale.core.spec import WhaleRunStatus, ...`` -> the status names from whale.core.status;
- in tests, a v1alpha1 document literal (a dict) wrapped in ``convert_v1alpha1(...)``, and a nested spec unpacked
  into a dict that adds v1alpha1 sections (``{**spec.to_wire(), "rsft": ...}``) flattened first (``flat(...)``);
- a domain's field of v1alpha1 (``data.mathSet``, ``spec.verifier.chessMove``...) -> ``domainOptions.mathSet``,
  in prose and strings (a Python attribute of a domain's options is the domain's own, rewritten by hand);
- the same paths in docs/*.md, README.md and the manifests' comments (manifests/**/*.yaml), and their fenced YAML WhaleRuns (by `whale migrate`'s function).

Idempotent (a rewritten path no longer matches) and re-runnable on any file: ``python scripts/split_spec_access.py
[PATH...]`` (default: whale/ operator/ domains/ tests/ benchmarks/ scripts/ docs/ README.md); ``--check`` lists
the files it would change and exits 1 if any. A receiver is a name ``spec``, ``SPEC`` or ``base_spec``, or a call
``WhaleRunSpec(...)``, ``WhaleRunSpec.model_validate(...)``, ``parse_spec(...)``, ``make_spec(...)``,
``specs[...]`` or the operator's ``effective(...)[0]``: a spec under another name
(``s.rsft``) is left for mypy to find.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = (
    "whale",
    "operator",
    "domains",
    "tests",
    "benchmarks",
    "scripts",
    "docs",
    "README.md",
    "manifests",
    "chart",
)
#: files that must keep the v1alpha1 names: the conversion itself, this script, the old manifests
SKIP = {
    "whale/core/convert.py",
    "whale/migrate.py",
    "scripts/split_spec_access.py",
    "tests/unit/test_migrate.py",
    "tests/unit/test_split_spec_access.py",
}
SKIP_DIRS = ("tests/fixtures/manifests_v1alpha1", "chart/crds")

#: section -> its v1alpha2 group; Python and wire spellings (whale.core.convert.TO_EXPERIMENT / TO_EXECUTION)
EXPERIMENT = ("model", "schedule", "rsft", "harness_search", "harnessSearch", "evaluation", "data", "verifier", "seed")
EXECUTION = ("storage", "inference", "retry", "train", "sandbox", "suspend", "tracking", "resume_from", "resumeFrom")
GROUP = {**dict.fromkeys(EXPERIMENT, "experiment"), **dict.fromkeys(EXECUTION, "execution")}
_ARGS = r"\((?:[^()\n]|\([^()\n]*\))*\)"
#: a name holding a spec, or a call that returns one (``WhaleRunSpec.model_validate(x)``, a test's ``make_spec()``)
_RECEIVER = (
    rf"(?<![\w.])(?:[A-Za-z_]\w*(?:{_ARGS})?\.)*(?:spec|SPEC|base_spec|specs\[[^\]\n]*\]"
    rf"|(?:WhaleRunSpec|ClusterRunSpec)\.model_validate{_ARGS}|(?:WhaleRunSpec|ClusterRunSpec){_ARGS}"
    rf"|make_spec{_ARGS}|parse_spec{_ARGS}"
    rf"|effective{_ARGS}\[0\])"
)
_SECTIONS = "|".join(sorted(GROUP, key=len, reverse=True))
PATH_RE = re.compile(rf"(?P<recv>{_RECEIVER})\.(?P<sec>{_SECTIONS})\b(?!\()")
#: a Kubernetes Job's or JobSet's own ``spec.suspend`` (not the run's), by the text around it
K8S_SUSPEND = (
    "its ``spec.suspend``",
    "every Job or JobSet is created suspended (`spec.suspend: true`)",
    "``spec.suspend: true``, then, for a Job",
)
COPY_RE = re.compile(rf"(?P<recv>{_RECEIVER})\.model_copy\(\s*update=\{{(?=\s*\"(?:{_SECTIONS})\")")

V1, V2 = "whale.dev/v1alpha1", "whale.dev/v1alpha2"
STATUS_NAMES = frozenset(
    {
        "RunPhase",
        "Stage",
        "Reason",
        "ConditionType",
        "BestEval",
        "Condition_",
        "MetaCondition",
        "EvalPoint",
        "IntegrityFlagStatus",
        "WhaleRunStatus",
    }
)


#: v1alpha1's fields of one domain (whale.core.convert.DOMAIN_FIELDS), by their wire path, now in domainOptions
DOMAIN_KEY_RE = re.compile(
    r"(?<![\w.])(?P<prefix>spec\.experiment\.|spec\.|experiment\.)?(?:data|verifier)\."
    r"(?P<key>mathSet|syntheticTask|corpus|mathAnswer|chessMove|searchAnswer)\b"
)


def _domain_key(m: re.Match[str]) -> str:
    prefix = "spec.experiment." if m["prefix"] in ("spec.", "spec.experiment.") else (m["prefix"] or "")
    return f"{prefix}domainOptions.{m['key']}"


def _path(m: re.Match[str]) -> str:
    return f"{m['recv']}.{GROUP[m['sec']]}.{m['sec']}"


def rewrite_paths(text: str) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        protected = [p for p in K8S_SUSPEND if p in line]
        for i, p in enumerate(protected):
            line = line.replace(p, f"\x00{i}\x00")
        line = DOMAIN_KEY_RE.sub(_domain_key, line)
        line = PATH_RE.sub(_path, line)
        line = COPY_RE.sub(lambda m: f"{m['recv']}.with_sections(**{{", line)
        for i, p in enumerate(protected):
            line = line.replace(f"\x00{i}\x00", p)
        out.append(line)
    # a copy written over several lines (``model_copy(\n    update={\n        "train": ...``)
    return COPY_RE.sub(lambda m: f"{m['recv']}.with_sections(**{{", "".join(out))


def _import_line(names: list[ast.alias], module: str, indent: str, comment: str = "") -> str:
    parts = [a.name if a.asname is None else f"{a.name} as {a.asname}" for a in names]
    return f"{indent}from {module} import {', '.join(parts)}{comment}\n"


def split_status_imports(text: str) -> str:
    """``from whale.core.spec import ...`` naming status types: those names imported from whale.core.status."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "whale.core.spec":
            status = [a for a in node.names if a.name in STATUS_NAMES]
            if status:
                edits.append((node, [a for a in node.names if a.name not in STATUS_NAMES], status))
    for node, rest, status in sorted(edits, key=lambda e: -e[0].lineno):
        start, end = node.lineno - 1, (node.end_lineno or node.lineno)
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        noqa = re.search(
            r"\s+#\s*noqa[^\n]*", "".join(lines[start:end])
        )  # kept on each line (E402 after a path set-up)
        comment = noqa.group(0) if noqa else ""
        new = (_import_line(rest, "whale.core.spec", indent, comment) if rest else "") + _import_line(
            status, "whale.core.status", indent, comment
        )
        lines[start:end] = [new]
    return "".join(lines)


FENCE_RE = re.compile(r"^(?P<open>```ya?ml[^\n]*\n)(?P<body>.*?)^(?P<close>```)", re.M | re.S)


def migrate_yaml_blocks(text: str) -> str:
    """Each fenced YAML block of a Markdown page that is a v1alpha1 WhaleRun, rewritten by `whale migrate`'s own
    function (whale.migrate.migrate_text); a block it cannot rewrite is left as it is and named on stderr."""
    from whale.migrate import MigrateError, migrate_text

    def one(m: re.Match[str]) -> str:
        body = m["body"]
        if "whale.dev/v1alpha1" not in body:
            return m[0]
        try:
            return m["open"] + migrate_text(body).text + m["close"]
        except MigrateError as exc:
            print(f"left as it is (a YAML block): {exc}", file=sys.stderr)
            return m[0]

    return FENCE_RE.sub(one, text)


def _is_v1alpha1_doc(node: ast.AST) -> bool:
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "apiVersion" and isinstance(v, ast.Constant) and v.value == V1
        for k, v in zip(node.keys, node.values, strict=True)
    )


def convert_document_literals(text: str) -> str:
    """A dict literal that is a v1alpha1 WhaleRun (``{"apiVersion": "whale.dev/v1alpha1", ...}``, as tests write
    them with a flat spec) wrapped in ``convert_v1alpha1(...)``, the one conversion, so it reaches the code as
    v1alpha2; and ``"whale.dev/v1alpha1", "whaleruns"`` API calls on the new version."""
    text = text.replace(f'"{V1}", "whaleruns"', f'"{V2}", "whaleruns"')
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    wrapped = {id(a) for n in ast.walk(tree) if _is_convert_call(n) for a in n.args}  # type: ignore[attr-defined]
    found = [n for n in ast.walk(tree) if _is_v1alpha1_doc(n) and id(n) not in wrapped]
    if not found:
        return text
    text = _wrap_in_call(text, found, "convert_v1alpha1")
    if "import convert_v1alpha1" not in text and not re.search(
        r"from whale\.core\.convert import .*convert_v1alpha1", text
    ):
        text = _add_import(text, "from whale.core.convert import convert_v1alpha1\n")
    return text


def _wrap_in_call(text: str, nodes: Sequence[ast.AST], function: str) -> str:
    """``text`` with the source of each of ``nodes`` (expressions parsed from it) wrapped as ``function(...)``."""
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    spans = sorted(
        ((offsets[n.lineno - 1] + n.col_offset, offsets[n.end_lineno - 1] + n.end_col_offset) for n in nodes),  # type: ignore[attr-defined]
        reverse=True,
    )
    for start, end in spans:
        text = f"{text[:start]}{function}({text[start:end]}){text[end:]}"
    return text


_FLAT_KEYS = frozenset(k for k in GROUP if not k.islower() or "_" not in k)


def flat_unpacks(text: str) -> str:
    """In a test, ``{**spec.to_wire(), "rsft": ...}`` (or ``model_dump``: a nested spec edited by v1alpha1's section names) becomes
    ``{**flat(spec.to_wire()), "rsft": ...}`` (tests/fixtures/specs.flat: the model reads the flat shape too)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        names = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        if not names & _FLAT_KEYS:
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                key is None
                and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in ("to_wire", "model_dump")
            ):
                found.append(value)
    if not found:
        return text
    text = _wrap_in_call(text, found, "flat")
    if not re.search(r"^from tests\.fixtures\.specs import .*\bflat\b", text, re.M):
        text = _add_import(text, "from tests.fixtures.specs import flat\n")
    return text


def _is_convert_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "convert_v1alpha1"


def _add_import(text: str, line: str) -> str:
    """``line`` after the module's first block of imports (ruff's isort puts it in its place)."""
    tree = ast.parse(text)
    last = max((n.end_lineno or n.lineno for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)), default=0)
    lines = text.splitlines(keepends=True)
    return "".join([*lines[:last], line, *lines[last:]])


def rewrite(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        text = migrate_yaml_blocks(text)
    text = rewrite_paths(text)
    if path.suffix == ".py":
        text = split_status_imports(text)
        if path.resolve().is_relative_to(ROOT / "tests"):
            text = convert_document_literals(text)
            text = flat_unpacks(text)
    return text


def files(paths: list[str]) -> list[Path]:
    out = []
    for p in paths:
        path = (ROOT / p) if not Path(p).is_absolute() else Path(p)
        found = [path] if path.is_file() else sorted(f for ext in ("py", "md", "yaml") for f in path.rglob(f"*.{ext}"))
        for f in found:
            rel = f.resolve().relative_to(ROOT).as_posix() if f.resolve().is_relative_to(ROOT) else str(f)
            if rel in SKIP or rel.startswith(SKIP_DIRS) or "/." in f"/{rel}" or "__pycache__" in rel:
                continue
            out.append(f)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=list(DEFAULT_PATHS))
    ap.add_argument("--check", action="store_true", help="only list the files it would change; exit 1 if any")
    args = ap.parse_args(argv)
    changed = []
    for f in files(args.paths):
        new = rewrite(f)
        if new != f.read_text(encoding="utf-8"):
            changed.append(f)
            if not args.check:
                f.write_text(new, encoding="utf-8")
    for f in changed:
        print(f)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
