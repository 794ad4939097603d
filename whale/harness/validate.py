"""Checks of a harness file before it runs: static (pure, on the source) and at load (in the sandbox).

Static rules, each with a name that appears in the error (``harness.py:12: [forbidden-import] ...``):

* ``syntax``             the file parses;
* ``forbidden-import``   imports only the domain's allow list and ``whale.harness.api``;
* ``relative-import``    no relative imports; ``star-import``: no ``from x import *``;
* ``forbidden-name``     no ``eval``/``exec``/``open``/``__import__``/``globals``/``vars``/``dir``/... and no
                         other dunder name (ways around the rules below);
* ``dunder-attribute``   no ``x.__globals__``-style attribute access (``__init__``/``__name__``/``__doc__`` are fine);
* ``private-attribute``  no ``x._name`` on anything but ``self``/``cls`` (a method's first parameter) and
                         ``super()``: ``random._os`` is the ``os`` module;
* ``introspection-attribute`` no frame/generator/traceback/code internals (``gi_frame``, ``f_back``,
                         ``f_globals``, ``tb_frame``, ...), which lead to other modules' globals;
* ``module-attribute``   on a module, only its public API (``__all__``) or an allowed submodule:
                         ``statistics.sys`` and ``re.enum.sys`` are ``sys``; ``string.Formatter``'s
                         ``get_field`` is a getattr by string;
* ``module-value``       a module is used only as ``module.name``, never as a value (``m = random``,
                         ``f(random)``), so the rule above sees every access;
* ``dynamic-attribute``  ``getattr``/``setattr``/``hasattr``/``delattr`` only called directly, with a
                         literal public name;
* ``format-attribute``   no format-string field that reads a private, dunder or introspection
                         attribute (``"{0._os}".format(random)``);
* ``self-rebind``        ``self``/``cls`` are never assigned (else the exemption above would cover anything);
* ``missing-class``      defines ``class Harness(...)`` at module level, with a base class;
* ``hook-signature``     hooks and helpers it overrides keep their parameters (the runtime calls by keyword);
* ``async-hook``         hooks are plain functions;
* ``constant-type``      literal constants have the documented types (``MAX_TURNS`` an int >= 1, ...);
* ``prompt-only``        (promptOnly search) nothing but ``SYSTEM_PROMPT``/``USER_TEMPLATE`` differs from h0.

The gate rejects the obvious ways to reach a module's internals; it is not the wall. A file that gets
past it still runs in the sandboxed worker (audit hook, confined imports) inside the process sandbox,
and no gold answer ever enters that process.

At load (:class:`whale.harness.process.HarnessProcess`, which every workload starts): the file runs in
the sandbox, ``Harness`` subclasses ``BaseHarness``, its constants have the right types at runtime; a file
that does not load is a ``HarnessLoadError``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import re
import string
import types
from collections.abc import Iterable
from pathlib import Path

from whale.harness import api

FORBIDDEN_NAMES = frozenset(
    {
        "__import__",
        "eval",
        "exec",
        "compile",
        "open",
        "input",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "dir",
        "__builtins__",
        "__loader__",
        "__spec__",
        "exit",
        "quit",
        "help",
        "memoryview",
    }
)
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__doc__", "__qualname__", "__module__"})
#: dunder names a harness may use as plain names
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__doc__"})
#: attributes that hand out frames, code and the globals behind them (not underscore-prefixed, so named)
INTROSPECTION_ATTRIBUTES = frozenset(
    {
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "cr_frame",
        "cr_code",
        "cr_await",
        "cr_origin",
        "ag_frame",
        "ag_code",
        "ag_await",
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "f_trace",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "co_names",
        "func_globals",
    }
)
#: public names of allowed modules that still give a way around the rules (a getattr by string)
DENIED_MODULE_NAMES: dict[str, frozenset[str]] = {"string": frozenset({"Formatter"})}
#: the getattr family: by-string attribute access
_DYNAMIC_ATTRIBUTE_FUNCTIONS = frozenset({"getattr", "setattr", "hasattr", "delattr"})
#: the only names exempt from the private-attribute rule (as a method's first parameter)
_SELF_NAMES = frozenset({"self", "cls"})
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
    """All static violations of ``source`` (empty = fine). Pure (reads the allowed modules' public names)."""
    allowed = frozenset(allowed_imports)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [Violation(exc.lineno or 1, "syntax", f"{exc.msg} (column {exc.offset or 0})")]
    out: list[Violation] = []
    modules = _module_aliases(tree, allowed)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _import_ok(alias.name, allowed):
                    out.append(_forbidden_import(node.lineno, alias.name, allowed))
        elif isinstance(node, ast.ImportFrom):
            out.extend(_check_import_from(node, allowed))
        elif isinstance(node, ast.Name):
            out.extend(_check_name(node))
        elif isinstance(node, ast.Attribute):
            out.extend(_check_attribute_name(node.attr, node.lineno))
            module = _resolve_module(node.value, modules, allowed)
            if module is not None:
                out.extend(_check_module_attribute(module, node.attr, node.lineno, allowed))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _DYNAMIC_ATTRIBUTE_FUNCTIONS
        ):
            out.extend(_check_dynamic_attribute(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "{" in node.value:
            out.extend(_check_format_fields(node.value, node.lineno))
    out.extend(_check_module_values(tree, modules))
    out.extend(_PrivateAccess().run(tree))
    out.extend(_check_class(tree))
    return sorted(set(out), key=lambda v: (v.line, v.rule, v.message))


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _private(name: str) -> bool:
    return name.startswith("_") and not _dunder(name)


def _check_attribute_name(name: str, line: int) -> list[Violation]:
    if _dunder(name) and name not in ALLOWED_DUNDERS:
        return [Violation(line, "dunder-attribute", f"attribute {name} is not allowed")]
    if name in INTROSPECTION_ATTRIBUTES:
        return [Violation(line, "introspection-attribute", f"attribute {name} (frame/code internals) is not allowed")]
    return []


def _check_name(node: ast.Name) -> list[Violation]:
    out = []
    if node.id in FORBIDDEN_NAMES or (_dunder(node.id) and node.id not in ALLOWED_DUNDER_NAMES):
        out.append(Violation(node.lineno, "forbidden-name", f"{node.id} is not allowed in a harness"))
    if node.id in _SELF_NAMES and not isinstance(node.ctx, ast.Load):
        out.append(Violation(node.lineno, "self-rebind", f"{node.id} must not be assigned or deleted"))
    return out


def _check_import_from(node: ast.ImportFrom, allowed: frozenset[str]) -> list[Violation]:
    if node.level:
        return [Violation(node.lineno, "relative-import", "relative imports are not allowed")]
    module = node.module or ""
    if not _import_ok(module, allowed):
        return [_forbidden_import(node.lineno, module, allowed)]
    out = []
    for alias in node.names:
        if alias.name == "*":
            out.append(Violation(node.lineno, "star-import", f"name what you import from {module} (no `import *`)"))
        else:
            out.extend(_check_module_attribute(module, alias.name, node.lineno, allowed))
        if alias.asname in _SELF_NAMES:
            out.append(Violation(node.lineno, "self-rebind", f"{alias.asname} must not be assigned"))
    return out


def _check_dynamic_attribute(node: ast.Call) -> list[Violation]:
    fn = node.func.id  # type: ignore[attr-defined]  # the caller passes calls of a plain name only
    name = node.args[1] if len(node.args) > 1 else None
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return [
            Violation(node.lineno, "dynamic-attribute", f"{fn} needs a literal attribute name as its second argument")
        ]
    if _dunder(name.value):
        return [Violation(node.lineno, "dunder-attribute", f"{fn} of {name.value} is not allowed")]
    if _private(name.value):
        return [Violation(node.lineno, "private-attribute", f"{fn} of {name.value} is not allowed")]
    if name.value in INTROSPECTION_ATTRIBUTES:
        return [Violation(node.lineno, "introspection-attribute", f"{fn} of {name.value} is not allowed")]
    return []


_FIELD_INDEX = re.compile(r"\[[^\]]*\]")


def _check_format_fields(text: str, line: int, depth: int = 0) -> list[Violation]:
    """Format fields of a string literal that read attributes: ``{0._os}``, ``{x.__class__}``."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return []  # not a valid format string: str.format would refuse it too
    out = []
    for _literal, field, spec, _conversion in parsed:
        for attribute in _FIELD_INDEX.sub("", field or "").split(".")[1:]:
            if (
                (_dunder(attribute) and attribute not in ALLOWED_DUNDERS)
                or _private(attribute)
                or attribute in INTROSPECTION_ATTRIBUTES
            ):
                out.append(
                    Violation(
                        line, "format-attribute", f"format field {{{field}}} reads attribute {attribute}; not allowed"
                    )
                )
        if spec and "{" in spec and depth < 3:
            out.extend(_check_format_fields(spec, line, depth + 1))
    return out


def _module_aliases(tree: ast.Module, allowed: frozenset[str]) -> dict[str, str]:
    """Names bound to modules by the file's imports -> the module's full name."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _is_submodule(node.module, alias.name, allowed):
                    aliases[alias.asname or alias.name] = full
    return aliases


def _resolve_module(node: ast.expr, modules: dict[str, str], allowed: frozenset[str]) -> str | None:
    """The module an expression names (``re``, ``collections.abc``), or None."""
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if isinstance(node, ast.Attribute):
        parent = _resolve_module(node.value, modules, allowed)
        if parent is not None and _is_submodule(parent, node.attr, allowed):
            return f"{parent}.{node.attr}"
    return None


def _is_submodule(module: str, name: str, allowed: frozenset[str]) -> bool:
    """``module.name`` is a module a harness may import (``collections.abc``; ``whale.harness`` on the
    way to the API module)."""
    full = f"{module}.{name}"
    if not (_import_ok(full, allowed) or api.API_MODULE.startswith(full + ".")):
        return False
    try:
        return importlib.util.find_spec(full) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=256)
def _public_names(module: str) -> frozenset[str] | None:
    """A module's public API: ``__all__``, else its non-underscore names that are not modules. None when
    the module cannot be imported here (its import fails in the sandbox as well)."""
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure: nothing to check against
        return None
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in vars(mod) if not n.startswith("_") and not isinstance(vars(mod)[n], types.ModuleType)]
    return frozenset(str(n) for n in names) - DENIED_MODULE_NAMES.get(module, frozenset())


def _check_module_attribute(module: str, name: str, line: int, allowed: frozenset[str]) -> list[Violation]:
    """``module.name`` (or ``from module import name``): public API or an allowed submodule only."""
    if _is_submodule(module, name, allowed):
        return []
    if not _import_ok(module, allowed):  # whale / whale.harness: only the way to the API module
        return [Violation(line, "module-attribute", f"{module}.{name} is not allowed; import {api.API_MODULE}")]
    public = _public_names(module)
    if public is None or name in public:
        return []
    if _dunder(name):
        return []  # reported by dunder-attribute
    return [
        Violation(
            line,
            "module-attribute",
            f"{module}.{name} is not part of {module}'s public API; use only the names it exports",
        )
    ]


def _check_module_values(tree: ast.Module, modules: dict[str, str]) -> list[Violation]:
    """A module name anywhere but as ``module.attribute`` (or its own import) is a module value."""
    if not modules:
        return []
    receivers = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in modules and id(node) not in receivers:
            out.append(
                Violation(
                    node.lineno, "module-value", f"module {node.id} may only be used as {node.id}.name, not as a value"
                )
            )
    return out


class _PrivateAccess(ast.NodeVisitor):
    """``x._name`` is allowed only when ``x`` is ``self``/``cls`` as the first parameter of a method
    (a function directly in a class body) or ``super()``; also checks that the getattr family is only
    ever called, never passed around."""

    def __init__(self) -> None:
        self.exempt: frozenset[str] = frozenset()
        self.out: list[Violation] = []
        self.calls: set[int] = set()

    def run(self, tree: ast.Module) -> list[Violation]:
        self.calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        self.visit(tree)
        return self.out

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.bases, *node.keywords, *node.decorator_list]:
            self.visit(expr)
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self._function(stmt, method=True)
            else:
                self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._function(node, method=False)

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815 - ast.NodeVisitor's method name

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            self.visit(default)
        outer, self.exempt = self.exempt, self.exempt - _params(node.args)
        self.visit(node.body)
        self.exempt = outer

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> None:
        for expr in [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            self.visit(expr)
        positional = [a.arg for a in node.args.posonlyargs + node.args.args]
        first = positional[0] if positional else None
        exempt = self.exempt - _params(node.args)
        if method and first in _SELF_NAMES:
            exempt |= {first}
        outer, self.exempt = self.exempt, exempt
        for stmt in node.body:
            self.visit(stmt)
        self.exempt = outer

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name in _SELF_NAMES:
            self.out.append(Violation(node.lineno, "self-rebind", f"{node.name} must not be assigned"))
        self.generic_visit(node)

    def visit_alias(self, node: ast.alias) -> None:
        if node.asname in _SELF_NAMES or (node.asname is None and node.name in _SELF_NAMES):
            self.out.append(
                Violation(getattr(node, "lineno", 1), "self-rebind", f"{node.asname or node.name} must not be assigned")
            )

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name in _SELF_NAMES:
            self.out.append(Violation(node.lineno, "self-rebind", f"{node.name} must not be assigned"))
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name in _SELF_NAMES:
            self.out.append(Violation(node.lineno, "self-rebind", f"{node.name} must not be assigned"))

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in _DYNAMIC_ATTRIBUTE_FUNCTIONS and id(node) not in self.calls:
            self.out.append(Violation(node.lineno, "dynamic-attribute", f"{node.id} may only be called directly"))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr) and not self._exempt(node.value):
            self.out.append(
                Violation(
                    node.lineno,
                    "private-attribute",
                    f"attribute {node.attr} is private; only self/cls/super() may use private names",
                )
            )
        self.generic_visit(node)

    def _exempt(self, value: ast.expr) -> bool:
        if isinstance(value, ast.Name):
            return value.id in self.exempt
        return (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
            and not value.args
            and not value.keywords
        )


def _params(args: ast.arguments) -> frozenset[str]:
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return frozenset(names)


def _import_ok(module: str, allowed: frozenset[str]) -> bool:
    """The API module, or an allowed top-level module or one of its public submodules (``re._parser`` is not)."""
    parts = module.split(".")
    return module == api.API_MODULE or (parts[0] in allowed and not any(p.startswith("_") for p in parts))


def _forbidden_import(line: int, module: str, allowed: frozenset[str]) -> Violation:
    listed = ", ".join(sorted(allowed)) or "(none)"
    return Violation(
        line, "forbidden-import", f"import of {module!r} is not allowed; allowed: {listed}, {api.API_MODULE}"
    )


def _find_class(tree: ast.Module) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == api.REQUIRED_CLASS:
            return node
    return None


def _check_class(tree: ast.Module) -> list[Violation]:
    cls = _find_class(tree)
    if cls is None:
        return [
            Violation(
                1,
                "missing-class",
                f"define `class {api.REQUIRED_CLASS}(BaseHarness)` at module level "
                f"(from {api.API_MODULE} import BaseHarness)",
            )
        ]
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
    literal: object = value.value if isinstance(value, ast.Constant) else []
    types = api.CONSTANTS[name]
    if not isinstance(literal, types) or (isinstance(literal, bool) and int in types):
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        return [Violation(line, "constant-type", f"{name} must be {want}")]
    if name == "MAX_TURNS" and isinstance(literal, int) and literal < 1:
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
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in api.PROMPT_CONSTANTS for t in node.targets)
            and not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str))
        ):
            out.append(Violation(node.lineno, "prompt-only", "prompt constants must be plain string literals"))
    cand_body, h0_body = _skeleton(cand_tree), _skeleton(h0_tree)
    for c, h in zip(cand_body, h0_body, strict=False):
        if ast.dump(c) != ast.dump(h):
            out.append(
                Violation(
                    _first_difference(c, h),
                    "prompt-only",
                    "only SYSTEM_PROMPT and USER_TEMPLATE may differ from h0; this statement does",
                )
            )
            break
    else:
        if len(cand_body) != len(h0_body):
            line = getattr(cand_body[len(h0_body)], "lineno", 1) if len(cand_body) > len(h0_body) else 1
            out.append(
                Violation(
                    line, "prompt-only", "statements were added or removed; only the two prompt constants may change"
                )
            )
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
        return [
            s
            for s in body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))
        ]

    body = strip(list(tree.body))
    out = []
    for stmt in body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == api.REQUIRED_CLASS:
            kept = [
                s
                for s in strip(stmt.body)
                if not (
                    isinstance(s, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id in api.PROMPT_CONSTANTS for t in s.targets)
                )
            ]
            stmt = ast.copy_location(
                ast.ClassDef(
                    name=stmt.name,
                    bases=stmt.bases,
                    keywords=stmt.keywords,
                    body=kept,
                    decorator_list=stmt.decorator_list,
                ),
                stmt,
            )
        elif isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            stmt.body = strip(stmt.body) or stmt.body
        out.append(stmt)
    return out


def validate_source(
    source: str, allowed_imports: Iterable[str], filename: str = "harness.py", h0: str | None = None
) -> None:
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
