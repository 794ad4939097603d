"""`whale migrate`: rewrite whale.dev/v1alpha1 manifests as whale.dev/v1alpha2, comments kept; and put a field
v1alpha2 moved since (``cluster.maxEvictions`` -> ``execution.retry.maxEvictions``: whale.core.convert.MOVED_FIELDS)
where it now lives.

The conversion itself is :func:`whale.core.convert.convert_v1alpha1` (pure, on parsed documents); this module
applies it to the text of a file so that the comments, the order and the quoting a person wrote stay. It moves
whole blocks of lines: each top-level entry of ``spec`` (with the comment lines above it and everything indented
under it) goes under ``experiment:`` or ``execution:``, indented one level more, so block scalars and nested
comments move unchanged. The result is checked: parsed, it must equal the conversion of the parsed original,
or nothing is written (:class:`MigrateError`, naming the file and why). Other documents of the file are kept
byte for byte.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from whale.core.convert import (
    MOVED_FIELDS,
    TO_EXECUTION,
    TO_EXPERIMENT,
    V1ALPHA1,
    V1ALPHA2,
    convert_v1alpha1,
    domain_field,
    move_fields,
)

_DOC_MARKER = re.compile(r"^---(\s|$)")
_TOP_KEY = re.compile(r"^[A-Za-z_\"']")
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*|\"[^\"]*\"|'[^']*')\s*:(\s|$)")
_API = re.compile(r"^apiVersion:\s*[\"']?whale\.dev/v1alpha1[\"']?(?P<rest>\s*(#.*)?)$")
_GROUP = {
    **{name: "experiment" for pair in TO_EXPERIMENT for name in pair},
    **{name: "execution" for pair in TO_EXECUTION for name in pair},
}


class MigrateError(ValueError):
    """A manifest this module cannot rewrite by moving lines (the message says why and what to do)."""


@dataclass(frozen=True)
class Migrated:
    text: str
    #: WhaleRun documents rewritten (0: the file was already whale.dev/v1alpha2, or holds no WhaleRun)
    documents: int


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_filler(line: str) -> bool:
    """A blank or comment-only line: it belongs to the entry below it."""
    return not line.strip() or line.lstrip().startswith("#")


def _entries(block: list[str], indent: int) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """The entries of a mapping block: (key, lines), each with the comment lines above it; and trailing fillers."""
    entries: list[tuple[str, list[str]]] = []
    pending: list[str] = []
    for line in block:
        m = _KEY.match(line)
        if m and len(m["indent"]) == indent:
            entries.append((m["key"].strip("\"'"), [*pending, line]))
            pending = []
        elif _is_filler(line):
            pending.append(line)
        elif entries and (_indent(line) > indent or line[indent:].startswith("- ")):
            entries[-1][1].extend([*pending, line])
            pending = []
        else:
            raise MigrateError(f"cannot read the line {line.rstrip()!r} as part of spec; migrate it by hand")
    return entries, pending


def _spec_start(lines: list[str]) -> int | None:
    """The line ``spec:`` of a document (a block mapping on lines of its own), or None."""
    return next((i for i, line in enumerate(lines) if re.match(r"^spec:\s*(#.*)?$", line)), None)


def _block_end(lines: list[str], start: int) -> int:
    """The end of the top-level entry starting at ``start``: the next top-level key, or the document's end."""
    return next((i for i in range(start + 1, len(lines)) if _TOP_KEY.match(lines[i])), len(lines))


def _child_indent(lines: list[str], i: int, end: int) -> int | None:
    """The indent of the entries under line ``i`` (its first non-filler line before ``end``), or None (none)."""
    return next((_indent(line) for line in lines[i + 1 : end] if not _is_filler(line)), None)


def _deeper(lines: list[str], by: int) -> list[str]:
    return [(" " * by + line) if line.strip() else line for line in lines]


def _split_domain_fields(
    key: str, entry: list[str], indent: int, domain: Any
) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """A ``data`` or ``verifier`` entry without its domain fields, and those fields' (domainOptions name, lines);
    another domain's fields are dropped (v1alpha1 ignored them)."""
    head = next(i for i, line in enumerate(entry) if (m := _KEY.match(line)) and len(m["indent"]) == indent)
    under = _child_indent(entry, head, len(entry))
    if under is None:  # flow style or empty: the check after the move judges it
        return entry, []
    children, trailing = _entries(entry[head + 1 :], under)
    kept: list[str] = []
    moved: list[tuple[str, list[str]]] = []
    for child, lines in children:
        name = domain_field(key, child, domain)
        if name is None:
            kept += lines
        elif name:
            moved.append((name, lines))
    if not moved or kept:
        return [*entry[: head + 1], *kept, *trailing], moved
    return [], moved  # the section held only domain fields


def _migrate_document(lines: list[str], domain: Any = None) -> list[str]:
    """One v1alpha1 WhaleRun document's lines as v1alpha2 (the caller checks the result)."""
    out = [(f"apiVersion: {V1ALPHA2}{m['rest']}\n" if (m := _API.match(line.rstrip("\n"))) else line) for line in lines]
    start = _spec_start(out)
    if start is None:
        raise MigrateError("spec is not a block mapping (`spec:` on a line of its own); migrate it by hand")
    end = _block_end(out, start)
    indent = _child_indent(out, start, end)
    if indent is None:
        return out
    entries, trailing = _entries(out[start + 1 : end], indent)
    groups: dict[str, list[str]] = {"experiment": [], "execution": []}
    top: list[str] = []
    cluster: list[str] = []
    options: list[tuple[str, list[str]]] = []
    for key, entry in entries:
        if key in ("data", "verifier"):
            entry, found = _split_domain_fields(key, entry, indent, domain)
            options += found
        if key in _GROUP:
            groups[_GROUP[key]].extend(_deeper(entry, indent))
        elif key == "cluster":
            cluster.extend(entry)
        else:
            top.extend(entry)
    if options:  # beside data, at its depth: each field keeps its own lines (comments included)
        child = _indent(next(line for _, ls in options for line in ls if not _is_filler(line)))
        block = [f"{' ' * indent}domainOptions:\n"]
        for name, field_lines in options:
            i = next(i for i, line in enumerate(field_lines) if _KEY.match(line) and _indent(line) == child)
            key = _KEY.match(field_lines[i])["key"]  # type: ignore[index]
            block += [*field_lines[:i], field_lines[i].replace(key, name, 1), *field_lines[i + 1 :]]
        groups["experiment"].extend(_deeper(block, indent))
    body = list(top)
    for name, moved in groups.items():
        if moved:
            body += [f"{' ' * indent}{name}:\n", *moved]
    body += cluster + trailing
    return out[: start + 1] + body + out[end:]


def _entry(lines: list[str], lo: int, hi: int, indent: int, key: str) -> tuple[int, int] | None:
    """The lines ``[i, end)`` of the entry ``key:`` at ``indent`` among ``lines[lo:hi]`` (its body: the lines
    indented deeper after it, fillers between them included), or None."""
    for i in range(lo, hi):
        m = _KEY.match(lines[i])
        if m and len(m["indent"]) == indent and m["key"].strip("\"'") == key:
            end = i + 1
            for j in range(i + 1, hi):
                if _is_filler(lines[j]):
                    continue
                if _indent(lines[j]) <= indent:
                    break
                end = j + 1
            return i, end
    return None


def _move_fields(lines: list[str]) -> list[str]:
    """One v1alpha2 document with each moved field set where it was put where it now lives (the caller checks)."""
    start = _spec_start(lines)
    if start is None:
        return lines
    out = list(lines)
    for old, new in MOVED_FIELDS:
        end = _block_end(out, start)
        step = _child_indent(out, start, end)
        if step is None:
            return out
        where: list[tuple[int, int]] = []
        lo, hi = start + 1, end
        level: int | None = step
        for key in old:
            found = _entry(out, lo, hi, level, key) if level is not None else None
            if found is None:
                break
            where.append(found)
            lo, hi, level = found[0] + 1, found[1], _child_indent(out, *found)
        if len(where) < len(old):
            continue
        i, leaf_end = where[-1]
        value = out[i].split(":", 1)[1].strip()
        if leaf_end != i + 1 or not value or value.startswith(("|", ">", "&", "*", "#")):
            raise MigrateError(f"spec.{'.'.join(old)} is not a plain value on one line; move it by hand")
        parent_i = where[-2][0]
        first = i  # the comment lines right above the field go with it
        while first - 1 > parent_i and out[first - 1].strip().startswith("#"):
            first -= 1
        comments = [line.strip() for line in out[first:i]]
        del out[first : i + 1]
        parent_end = where[-2][1] - (i + 1 - first)
        if _child_indent(out, parent_i, parent_end) is None:  # the section held only the moved field
            del out[parent_i:parent_end]
        lo, hi, indent = start + 1, _block_end(out, start), step
        for depth, key in enumerate(new):
            found = _entry(out, lo, hi, indent, key)
            if found is None:  # created at the end of its parent: the rest of the path, then the value
                rest = [f"{' ' * (indent + step * k)}{name}:\n" for k, name in enumerate(new[depth:-1])]
                pad = " " * (indent + step * (len(new) - depth - 1))
                leaf = [*(f"{pad}{c}\n" for c in comments), f"{pad}{new[-1]}: {value}\n"]
                while hi > lo and _is_filler(out[hi - 1]):
                    hi -= 1
                out[hi:hi] = [*rest, *leaf]
                break
            if depth == len(new) - 1:
                raise MigrateError(f"spec.{'.'.join(old)} and spec.{'.'.join(new)} are both set; remove the first")
            lo, hi = found[0] + 1, found[1]
            indent = _child_indent(out, *found) or indent + step
    return out


def _without_empty(spec: Any) -> Any:
    """A spec without an emptied section (a moved field was its only one): the rewrite drops the section."""
    if not isinstance(spec, dict):
        return spec
    return {k: v for k, v in spec.items() if v != {} or k not in {old[0] for old, _ in MOVED_FIELDS}}


def _split_documents(text: str) -> list[list[str]]:
    docs: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _DOC_MARKER.match(line) and docs[-1]:
            docs.append([])
        docs[-1].append(line)
    return docs


def _load(lines: list[str]) -> Any:
    body = [line for line in lines if not _DOC_MARKER.match(line)]
    return yaml.safe_load("".join(body))


def migrate_text(text: str) -> Migrated:
    """The file's text with each v1alpha1 WhaleRun rewritten (others as they are); raises :class:`MigrateError`."""
    if not text.endswith("\n"):
        text += "\n"
    out: list[str] = []
    count = 0
    for doc in _split_documents(text):
        try:
            parsed = _load(doc)
        except yaml.YAMLError as exc:
            raise MigrateError(f"not YAML: {exc}") from None
        if not (isinstance(parsed, dict) and parsed.get("apiVersion") in (V1ALPHA1, V1ALPHA2)):
            out.extend(doc)
            continue
        spec = parsed.get("spec")
        new = doc
        if parsed["apiVersion"] == V1ALPHA1:
            new = _migrate_document(doc, spec.get("domain") if isinstance(spec, dict) else None)
        new = _move_fields(new)
        if new == doc:
            out.extend(doc)
            continue
        expected = convert_v1alpha1(parsed)
        expected["spec"] = _without_empty(move_fields(expected.get("spec")))
        try:
            same = _load(new) == expected
        except yaml.YAMLError:
            same = False
        if not same:
            raise MigrateError(
                "moving the lines of spec does not give the converted manifest (an unusual layout: anchors, flow "
                "style or keys indented unevenly); migrate it by hand (docs/operator.md#migrating-from-v1alpha1)"
            )
        out.extend(new)
        count += 1
    return Migrated("".join(out), count)


#: annotations a dump carries that a new object must not (kubectl's copy of the old, v1alpha1 object)
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def _recreatable(run: dict[str, Any]) -> dict[str, Any]:
    """A WhaleRun read from a cluster (v1alpha1) as a v1alpha2 object to create: the server's fields (uid,
    resourceVersion, status...) dropped, and ``execution.resumeFrom`` naming the store it had."""
    new = convert_v1alpha1(run)
    meta = run.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "namespace", "labels") if k in meta}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROPPED_ANNOTATIONS}
    if annotations:
        keep["annotations"] = annotations
    spec = dict(new.get("spec") or {})
    execution = dict(spec.get("execution") or {})
    if meta.get("uid") and not execution.get("resumeFrom"):
        execution["resumeFrom"] = meta["uid"]  # its store is <storage.uri>/<namespace>/<name>.<uid>
    spec["execution"] = execution
    return {"apiVersion": V1ALPHA2, "kind": run.get("kind"), "metadata": keep, "spec": spec}


def migrate_cluster_dump(text: str) -> Migrated:
    """``kubectl get whaleruns -o yaml`` output (one object or a List) as v1alpha2 objects to ``kubectl create``,
    each resuming the store of the object it replaces. Comments are not kept (a dump has none)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise MigrateError(f"not YAML: {exc}") from None
    runs: list[dict[str, Any]] = []
    for doc in docs:
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind", "").endswith("List") else [doc]
        runs += [i for i in items or [] if isinstance(i, dict) and i.get("apiVersion") == V1ALPHA1]
    out = "---\n".join(yaml.safe_dump(_recreatable(r), sort_keys=False, width=120) for r in runs)
    return Migrated(out, len(runs))


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename (a reader sees the old file or the new one, never half)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
