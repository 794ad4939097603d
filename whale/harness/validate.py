"""Checks of a harness file before it runs: static (pure, on the source) and at load (in the sandbox).

Static rules, each with a name that appears in the error (``harness.py:12: [forbidden-import] ...``):

* ``syntax``            the file parses;
* ``forbidden-import``  imports only the domain's allow list and ``whale.harness.api``;
* ``relative-import``   no relative imports;
* ``forbidden-name``    no ``eval``/``exec``/``open``/``__import__``/``globals``/... (ways around the above);
* ``dunder-attribute``  no ``x.__globals__``-style attribute access (``__init__``/``__name__``/``__doc__`` are fine);
* ``missing-class``     defines ``class Harness(...)`` at module level, with a base class;
* ``hook-signature``    hooks and helpers it overrides keep their parameters (the runtime calls by keyword);
* ``async-hook``        hooks are plain functions;
* ``constant-type``     literal constants have the documented types (``MAX_TURNS`` an int >= 1, ...);
* ``prompt-only``       (promptOnly search) nothing but ``SYSTEM_PROMPT``/``USER_TEMPLATE`` differs from h0.

At load (:func:`check_loads`): the file runs in the sandbox, ``Harness`` subclasses ``BaseHarness``,
its constants have the right types at runtime.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path

from whale.harness import api

FORBIDDEN_NAMES = frozenset(
    {
        "__import__", "eval", "exec", "compile", "open", "input", "breakpoint", "globals", "locals", "vars",
        "__builtins__", "__loader__", "__spec__", "exit", "quit", "help", "memoryview",
    }
)
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__doc__", "__qualname__", "__module__"})
_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", type(None): "None"}


@dataclasses.dataclass(frozen=True)
class Violation:
    line: int
    rule: str
    message: str

    def render(self, filename: str) -> str:
        return f"{filename}:{self.line}: [{self.rule}] {self.message}"


class HarnessValidationError(ValueError):
    """A harness file broke one or more rules; ``str()`` lists them, one per line, with line numbers."""

    def __init__(self, filename: str, violations: list[Violation]):
        self.filename, self.violations = filename, violations
        super().__init__("\n".join(v.render(filename) for v in violations))


def check_source(source: str, allowed_imports: Iterable[str]) -> list[Violation]:
    """All static violations of ``source`` (empty = fine). Pure."""
    allowed = frozenset(allowed_imports)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [Violation(exc.lineno or 1, "syntax", f"{exc.msg} (column {exc.offset or 0})")]
    out: list[Violation] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _import_ok(alias.name, allowed):
                    out.append(_forbidden_import(node.lineno, alias.name, allowed))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append(Violation(node.lineno, "relative-import", "relative imports are not allowed"))
            elif not _import_ok(node.module or "", allowed):
                out.append(_forbidden_import(node.lineno, node.module or "", allowed))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            out.append(Violation(node.lineno, "forbidden-name", f"{node.id} is not allowed in a harness"))
        elif isinstance(node, ast.Attribute) and _dunder(node.attr) and node.attr not in ALLOWED_DUNDERS:
            out.append(Violation(node.lineno, "dunder-attribute", f"attribute {node.attr} is not allowed"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "delattr", "hasattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and _dunder(str(node.args[1].value)):
                out.append(Violation(node.lineno, "dunder-attribute", f"{node.func.id} of {node.args[1].value} is not allowed"))
    out.extend(_check_class(tree))
    return sorted(out, key=lambda v: (v.line, v.rule))


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _import_ok(module: str, allowed: frozenset[str]) -> bool:
    return module == api.API_MODULE or module.split(".")[0] in allowed


def _forbidden_import(line: int, module: str, allowed: frozenset[str]) -> Violation:
    listed = ", ".join(sorted(allowed)) or "(none)"
    return Violation(line, "forbidden-import", f"import of {module!r} is not allowed; allowed: {listed}, {api.API_MODULE}")


def _find_class(tree: ast.Module) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == api.REQUIRED_CLASS:
            return node
    return None


def _check_class(tree: ast.Module) -> list[Violation]:
    cls = _find_class(tree)
    if cls is None:
        return [Violation(1, "missing-class", f"define `class {api.REQUIRED_CLASS}(BaseHarness)` at module level "
                          f"(from {api.API_MODULE} import BaseHarness)")]
    out = []
    if not cls.bases:
        out.append(Violation(cls.lineno, "missing-class", f"class {api.REQUIRED_CLASS} must subclass BaseHarness"))
    expected = {**api.HOOKS, **api.HELPERS}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in expected:
            if isinstance(node, ast.AsyncFunctionDef):
                out.append(Violation(node.lineno, "async-hook", f"{node.name} must be a plain def, not async def"))
            params = [a.arg for a in node.args.posonlyargs + node.args.args][1:]
            required = list(expected[node.name])
            if params != required or node.args.vararg or node.args.kwonlyargs:
                want = ", ".join(["self", *required])
                out.append(Violation(node.lineno, "hook-signature", f"{node.name} must be def {node.name}({want})"))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in api.CONSTANTS and node.value is not None:
                    out.extend(_check_constant(target.id, node.value, node.lineno))
    return out


def _check_constant(name: str, value: ast.expr, line: int) -> list[Violation]:
    if not isinstance(value, ast.Constant | ast.List):
        return []  # computed: checked at load time
    literal = value.value if isinstance(value, ast.Constant) else []
    types = api.CONSTANTS[name]
    if not isinstance(literal, types) or (isinstance(literal, bool) and int in types):
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        return [Violation(line, "constant-type", f"{name} must be {want}")]
    if name == "MAX_TURNS" and literal < 1:
        return [Violation(line, "constant-type", "MAX_TURNS must be >= 1")]
    return []


def check_prompt_only(candidate: str, h0: str) -> list[Violation]:
    """promptOnly search (the FST baseline): the candidate may differ from h0 only in the string
    values of ``SYSTEM_PROMPT`` and ``USER_TEMPLATE`` inside ``class Harness`` (docstrings ignored)."""
    try:
        cand_tree, h0_tree = ast.parse(candidate), ast.parse(h0)
    except SyntaxError as exc:
        return [Violation(exc.lineno or 1, "syntax", exc.msg)]
    out = []
    cls = _find_class(cand_tree)
    for node in cls.body if cls else []:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in api.PROMPT_CONSTANTS for t in node.targets):
            if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                out.append(Violation(node.lineno, "prompt-only", "prompt constants must be plain string literals"))
    cand_body, h0_body = _skeleton(cand_tree), _skeleton(h0_tree)
    for c, h in zip(cand_body, h0_body, strict=False):
        if ast.dump(c) != ast.dump(h):
            out.append(Violation(_first_difference(c, h), "prompt-only",
                                 "only SYSTEM_PROMPT and USER_TEMPLATE may differ from h0; this statement does"))
            break
    else:
        if len(cand_body) != len(h0_body):
            line = getattr(cand_body[len(h0_body)], "lineno", 1) if len(cand_body) > len(h0_body) else 1
            out.append(Violation(line, "prompt-only", "statements were added or removed; only the two prompt constants may change"))
    return out


def _first_difference(c: ast.stmt, h: ast.stmt) -> int:
    """The line of the first differing member when both are classes, else of the statement."""
    if isinstance(c, ast.ClassDef) and isinstance(h, ast.ClassDef):
        for cm, hm in zip(c.body, h.body, strict=False):
            if ast.dump(cm) != ast.dump(hm):
                return cm.lineno
        if len(c.body) > len(h.body):
            return c.body[len(h.body)].lineno
    return getattr(c, "lineno", 1)


def _skeleton(tree: ast.Module) -> list[ast.stmt]:
    """Top-level statements with docstrings and the two prompt assignments of Harness removed."""

    def strip(body: list[ast.stmt]) -> list[ast.stmt]:
        return [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]

    body = strip(list(tree.body))
    out = []
    for stmt in body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == api.REQUIRED_CLASS:
            kept = [
                s for s in strip(stmt.body)
                if not (isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id in api.PROMPT_CONSTANTS for t in s.targets))
            ]
            stmt = ast.copy_location(
                ast.ClassDef(name=stmt.name, bases=stmt.bases, keywords=stmt.keywords, body=kept, decorator_list=stmt.decorator_list),
                stmt,
            )
        elif isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            stmt.body = strip(stmt.body) or stmt.body
        out.append(stmt)
    return out


def validate_source(source: str, allowed_imports: Iterable[str], filename: str = "harness.py", h0: str | None = None) -> None:
    """Raise :class:`HarnessValidationError` when ``source`` breaks a static rule
    (and, given ``h0``, the promptOnly rule)."""
    violations = check_source(source, allowed_imports)
    if h0 is not None and not violations:
        violations = check_prompt_only(source, h0)
    if violations:
        raise HarnessValidationError(filename, violations)


def validate_file(path: Path, allowed_imports: Iterable[str], h0_path: Path | None = None) -> None:
    """:func:`validate_source` on a file; ``h0_path`` turns on the promptOnly rule."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessValidationError(path.name, [Violation(1, "syntax", f"cannot read the file: {exc}")]) from exc
    h0 = Path(h0_path).read_text(encoding="utf-8") if h0_path is not None else None
    validate_source(source, allowed_imports, path.name, h0)


async def check_loads(path: Path, allowed_imports: Iterable[str], limits: object | None = None) -> dict[str, object]:
    """Static checks, then load the file in the sandbox; returns what it declared (max_turns, tools,
    constants). Raises :class:`HarnessValidationError` (rule ``load``) when it does not load."""
    from whale.harness.process import HarnessLoadError, HarnessProcess

    allowed = frozenset(allowed_imports)
    validate_file(path, allowed)
    try:
        async with HarnessProcess(Path(path), allowed, limits) as proc:  # type: ignore[arg-type]
            info = await proc.start()
    except HarnessLoadError as exc:
        raise HarnessValidationError(Path(path).name, [Violation(_line_of(str(exc)), "load", str(exc))]) from exc
    return {"max_turns": info.max_turns, "tools": info.tools, "constants": info.constants}


def _line_of(message: str) -> int:
    match = re.search(r"harness line (\d+)", message)
    return int(match.group(1)) if match else 1
