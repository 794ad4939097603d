"""Reading a WhaleRun manifest (the file `kubectl apply` and `whale run` both take) and checking it.

Every problem is collected and reported with the field path in the manifest's own camelCase
spelling, so one `whale validate` lists everything to fix.

A manifest is input from a person, not a program, so reading it is bounded before anything is
parsed: the file is at most ``MAX_MANIFEST_BYTES``; it must be UTF-8 (a UTF-16/32 file is named as
such); its YAML is scanned event by event (iteratively: no recursion) for nesting deeper than
``MAX_DEPTH`` and for more than ``MAX_NODES`` nodes once aliases are expanded (a "billion laughs"
file), before a loader that refuses duplicate keys builds it. Every failure is a ``ManifestError``
naming where it is; nothing here lets a traceback out.

A file may hold several documents (a Namespace or a Secret next to the run, for `kubectl apply`):
every document is checked, exactly one must be a WhaleRun, and the others must be Kubernetes
objects (``apiVersion`` and ``kind``), which `whale run` ignores (``Manifest.ignored`` names them).

:func:`local_problems` checks what the schema cannot and a run on this machine needs before any phase
starts — the local model folder, the replay proposer's script, the data root — so `whale validate` (and
`whale run`, before it starts) name the field instead of a phase failing an hour in.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from whale import hub, plugins
from whale.core.convert import V1ALPHA1, convert_v1alpha1, is_v1alpha1_spec, moved_fields
from whale.core.layout import RUN_NAME_MAX_LEN, check_run_name
from whale.core.spec import (
    API_GROUP,
    API_VERSION,
    DNS1123_LABEL,
    KIND,
    LABEL_VALUE,
    PATTERN_HINTS,
    QUALIFIED_NAME,
    WhaleRunSpec,
)
from whale.metaharness import proposer
from whale.rsft.architecture import Architecture, training_problems

#: a WhaleRun manifest is a few kilobytes; this leaves room for comments and neighbouring documents
MAX_MANIFEST_BYTES = 1024 * 1024
#: mappings and lists nested deeper than this are refused (the spec itself is 5 levels deep)
MAX_DEPTH = 64
#: YAML nodes in the file, counting every node an alias stands for (a manifest has a few hundred)
MAX_NODES = 20_000
#: problems listed for one document; the rest are counted
MAX_PROBLEMS = 50

_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: fast, iterative
_BOMS = (  # longest first: UTF-32-LE's mark starts with UTF-16-LE's
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


class ManifestError(ValueError):
    """A manifest that cannot run; ``problems`` lists every reason, each naming its field."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        super().__init__(f"{source}: " + "; ".join(problems))


@dataclass(frozen=True)
class Manifest:
    name: str
    namespace: str | None
    spec: WhaleRunSpec
    raw: dict[str, Any] = field(repr=False)
    #: the file's other documents, which `whale run` does not use: "document 2 (v1 Secret)"
    ignored: tuple[str, ...] = ()
    #: the apiVersion the file was written in when it is an older one, converted on load (`whale migrate` rewrites it)
    converted_from: str | None = None
    #: fields set where v1alpha2 had them before they moved, read where they now live (whale.core.convert)
    notices: tuple[str, ...] = ()


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters: an error message never echoes a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _loc(loc: tuple[Any, ...]) -> str:
    parts = ["spec"]
    for p in loc:
        if p == "[key]":  # pydantic marks a problem with a mapping's key itself
            parts[-1] += " (the key)"
        elif isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            text = str(p)
            parts.append(text if len(text) <= 60 else text[:57] + "...")
    return ".".join(parts).replace(".[", "[")


def format_validation_error(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; fields are camelCase)"
        elif err["type"] == "enum" or err["type"] == "literal_error":
            msg = msg.replace("Input should be", "must be one of:") if "Input should be" in msg else msg
        elif err["type"] == "string_pattern_mismatch":
            msg = PATTERN_HINTS.get(str((err.get("ctx") or {}).get("pattern")), msg)
        elif err["type"] == "finite_number":
            msg = "must be a finite number (not .inf or .nan)"
        elif err["type"] in ("int_type", "int_from_float", "int_parsing"):
            msg = f"must be an integer (got {_short(err.get('input'), 30)})"
        elif err["type"] in ("bool_type", "bool_parsing"):
            msg = f"must be true or false (got {_short(err.get('input'), 30)})"
        out.append(f"{_loc(err['loc'])}: {msg}")
    return out


def _bounded(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return [*problems[:MAX_PROBLEMS], f"... and {len(problems) - MAX_PROBLEMS} more problems"]


def parse_document(doc: Any, source: str = "manifest", check_domain: bool = True) -> Manifest:
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise ManifestError(source, ["the document is not a mapping; expected a WhaleRun object"])
    api = doc.get("apiVersion")
    converted_from = None
    if api == V1ALPHA1:  # the previous version: read as this one (whale.core.convert), with a notice
        doc, converted_from = convert_v1alpha1(doc), V1ALPHA1
    elif api != f"{API_GROUP}/{API_VERSION}":
        problems.append(
            f"apiVersion: must be {API_GROUP}/{API_VERSION} (or {V1ALPHA1}, converted on load), got {_short(api)}"
        )
    if doc.get("kind") != KIND:
        problems.append(f"kind: must be {KIND}, got {_short(doc.get('kind'))}")
    meta = doc.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        problems.append("metadata: must be a mapping with the run's name")
        meta = {}
    name = meta.get("name")
    if name is None or name == "":
        problems.append(
            f"metadata.name: required (the run's name: a DNS-1035 label of at most {RUN_NAME_MAX_LEN} characters)"
        )
    elif not isinstance(name, str):
        problems.append(f"metadata.name: must be a string, got {_short(name)}")
    else:
        try:
            check_run_name(name)
        except ValueError as exc:
            problems.append(f"metadata.name: {exc}")
    problems.extend(_label_problems(meta.get("labels")))
    namespace = meta.get("namespace")
    if namespace is not None:
        try:
            _check_namespace(namespace)
        except ValueError as exc:
            problems.append(f"metadata.namespace: {exc}")
    raw_spec = doc.get("spec")
    spec = None
    if not isinstance(raw_spec, dict):
        problems.append("spec: required mapping")
    elif api == f"{API_GROUP}/{API_VERSION}" and is_v1alpha1_spec(raw_spec):
        moved = ", ".join(f"spec.{k}" for k in raw_spec if k not in ("domain", "condition", "cluster"))[:200]
        problems.append(
            f"spec: {moved} sit at the top of spec as in {V1ALPHA1}; {API_GROUP}/{API_VERSION} groups them under "
            f"spec.experiment and spec.execution: run `whale migrate FILE` (or set apiVersion: {V1ALPHA1})"
        )
    else:
        try:
            spec = WhaleRunSpec.model_validate(raw_spec)
        except ValidationError as exc:
            problems.extend(format_validation_error(exc))
        else:  # a proposer without its endpoint, model or key fails here, not when its phase starts
            problems.extend(str(p) for p in proposer.spec_problems(spec))
        if check_domain and isinstance(raw_spec.get("domain"), str):
            known = plugins.available()
            if raw_spec["domain"] not in known:
                problems.append(
                    f"spec.domain: unknown domain {_short(raw_spec['domain'])}; registered: "
                    f"{', '.join(known) or '(none)'}"
                )
            elif spec is not None:  # the domain's own options, by its own model (domains/<d>/options.py)
                problems.extend(_domain_options_problems(spec))
    if problems or spec is None or not isinstance(name, str):
        raise ManifestError(source, _bounded(problems))
    notices = tuple(moved_fields(raw_spec))
    return Manifest(name=name, namespace=namespace, spec=spec, raw=doc, converted_from=converted_from, notices=notices)


def _domain_options_problems(spec: WhaleRunSpec) -> list[str]:
    from whale.domain import DomainOptionsError, for_run

    try:
        for_run(plugins.load(spec.domain), spec.experiment.domain_options)
    except DomainOptionsError as exc:
        return list(exc.problems)
    except plugins.DomainLoadError as exc:
        return [f"spec.domain: {exc}"]
    return []


_NAMESPACE_RE = re.compile(DNS1123_LABEL.removeprefix("^").removesuffix("$"))
_LABEL_KEY_RE = re.compile(QUALIFIED_NAME.removeprefix("^").removesuffix("$"))
_LABEL_VALUE_RE = re.compile(LABEL_VALUE.removeprefix("^").removesuffix("$"))


def _label_problems(labels: Any) -> list[str]:
    """``metadata.labels`` as Kubernetes has them (the operator copies them onto the run's children): no
    newline, no space, bounded."""
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return ["metadata.labels: must be a mapping of label keys to values"]
    out = []
    for key, value in list(labels.items())[:64]:
        if not isinstance(key, str) or len(key) > 317 or not _LABEL_KEY_RE.fullmatch(key):
            out.append(f"metadata.labels: key {_short(key)} is not a label key ([prefix/]name of letters, digits, -_.)")
        elif not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
            out.append(
                f"metadata.labels.{key}: {_short(value)} is not a label value: at most 63 letters, digits, '-', '_' "
                "and '.', starting and ending with a letter or digit (no spaces or newlines)"
            )
    if len(labels) > 64:
        out.append(f"metadata.labels: {len(labels)} labels; at most 64")
    return out


def _check_namespace(namespace: Any) -> None:
    if not isinstance(namespace, str) or len(namespace) > 63 or not _NAMESPACE_RE.fullmatch(namespace):
        raise ValueError(
            f"{_short(namespace)} is not a namespace name: "
            f"{PATTERN_HINTS[DNS1123_LABEL].removeprefix('must be ')}, at most 63 characters"
        )


# ----- reading the file ---------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """The file as text: at most ``MAX_MANIFEST_BYTES``, strictly UTF-8 (a UTF-8 BOM is allowed)."""
    source = str(path)
    try:
        # NOTE: O_NONBLOCK only for the open: a FIFO nobody writes to would block open() for ever;
        # reading it then finds no writer and ends at once
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(source, [f"cannot read the file: {exc.strerror or exc}"]) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            source,
            [f"the file is larger than {MAX_MANIFEST_BYTES // 1024} KiB; a WhaleRun manifest is a few kilobytes"],
        )
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise ManifestError(
                source, [f"the file is {encoding} (it starts with a {encoding} byte-order mark); save it as UTF-8"]
            )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        hint = " (UTF-16 without a byte-order mark?)" if b"\x00" in data else ""
        raise ManifestError(
            source,
            [
                f"the file is not UTF-8{hint}: byte 0x{data[exc.start]:02x} at line {line}, column {column}; "
                "save it as UTF-8"
            ],
        ) from None
    if "\x00" in text:
        raise ManifestError(
            source,
            [
                "the file contains NUL bytes: it looks like UTF-16 without a byte-order "
                "mark, or binary; save it as UTF-8 text"
            ],
        )
    return text


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"


def check_structure(text: str) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` and more than ``MAX_NODES`` nodes (aliases expanded)
    by walking the parser's events: a flat loop, so no depth can exhaust the stack.

    Raises ``ValueError`` naming the line; ``yaml.YAMLError`` for text that is not YAML."""
    depth = 0
    expanded = 0  # every node so far, an alias counting as the whole node it stands for
    anchors: dict[str, int] = {}
    open_at: list[tuple[str | None, int]] = []  # per open collection: (anchor, `expanded` at its start)
    for event in yaml.parse(text, Loader=_PARSER):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep at {_where(event.start_mark)}")
            open_at.append((event.anchor, expanded))
            expanded += 1
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1
            anchor, start = open_at.pop()
            if anchor is not None:
                anchors[anchor] = expanded - start
        elif isinstance(event, yaml.ScalarEvent):
            expanded += 1
            if event.anchor is not None:
                anchors[event.anchor] = 1
            if not event.style and event.implicit[0]:  # plain (the C parser says "", the Python one None)
                _check_plain_scalar(event)
        elif isinstance(event, yaml.AliasEvent):
            expanded += anchors.get(event.anchor, 1) if event.anchor is not None else 1
        else:
            continue
        if expanded > MAX_NODES:
            raise ValueError(
                f"more than {MAX_NODES} YAML nodes (aliases counted as what they stand for) by "
                f"{_where(event.start_mark)}; a WhaleRun manifest has a few hundred"
            )


#: plain scalars whose value differs between YAML 1.1 (PyYAML, kubectl's older decoders) and YAML 1.2: a
#: base-60 number (``1:30`` is 90 in 1.1, a string in 1.2), a leading-zero number (``010``: 8 in 1.1, 10 in
#: 1.2), an underscore in a number (``1_000``), and the 1.1-only booleans (``yes``, ``no``, ``on``, ``off``)
_AMBIGUOUS_SCALARS = (
    (re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"), "a base-60 number in YAML 1.1"),
    (re.compile(r"[-+]?0[0-9_]+(\.[0-9_]*)?"), "octal in YAML 1.1, decimal in YAML 1.2"),
    (re.compile(r"[-+]?[0-9][0-9_]*_[0-9_]*(\.[0-9_]*)?"), "a number in YAML 1.1, a string in YAML 1.2"),
    (re.compile(r"yes|no|on|off", re.IGNORECASE), "a boolean in YAML 1.1, a string in YAML 1.2"),
)


def _check_plain_scalar(event: Any) -> None:
    """Refuse an unquoted scalar that YAML 1.1 and 1.2 read differently: quote it, or write it plainly."""
    value = event.value
    if len(value) > 40:
        return
    for pattern, why in _AMBIGUOUS_SCALARS:
        if pattern.fullmatch(value):
            raise ValueError(
                f"{value!r} at {_where(event.start_mark)} is {why}, so tools read it differently: write the value "
                f"you mean plainly (a number without leading zeros, ':' or '_'; true or false) or quote it ('{value}')"
            )


class _StrictLoader(_PARSER):  # type: ignore[misc, valid-type]  # the C loader where PyYAML has it, else the Python one
    """Safe YAML, except that a key given twice in one mapping is an error, not "the last one wins"."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: the base constructor reports it
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {_short(key)} (first at {_where(first.start_mark)})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def load_documents(text: str, source: str) -> list[tuple[int, Any]]:
    """``(1-based document number, value)`` of every non-empty document."""
    try:
        check_structure(text)
        docs = list(yaml.load_all(text, Loader=_StrictLoader))
    except yaml.YAMLError as exc:
        raise ManifestError(source, [f"not valid YAML: {exc}"]) from None
    except (ValueError, RecursionError) as exc:
        raise ManifestError(source, [f"refused: {exc}"]) from None
    return [(i, d) for i, d in enumerate(docs, start=1) if d is not None]


_NOT_AN_OBJECT = "not a Kubernetes object"


def _describe(doc: Any) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("kind"), str) and isinstance(doc.get("apiVersion"), str):
        return f"{doc['apiVersion'][:40]} {doc['kind'][:40]}"
    return _NOT_AN_OBJECT


def _is_ours(doc: Any) -> bool:
    """A WhaleRun, or meant to be one (our API group with a misspelt kind)."""
    if not isinstance(doc, dict):
        return False
    api = doc.get("apiVersion")
    return doc.get("kind") == KIND or (isinstance(api, str) and api.startswith(f"{API_GROUP}/"))


def load_manifest(path: Path, check_domain: bool = True) -> Manifest:
    """Load the one WhaleRun in ``path``, checking every document of the file."""
    source = str(path)
    docs = load_documents(read_text(Path(path)), source)
    if not docs:
        raise ManifestError(source, [f"the file is empty; expected a {KIND} object"])
    if len(docs) == 1:
        return parse_document(docs[0][1], source, check_domain)
    runs = [(i, d) for i, d in docs if _is_ours(d)]
    problems = [
        f"document {i}: not a Kubernetes object (a mapping with apiVersion and kind)"
        for i, d in docs
        if not _is_ours(d) and _describe(d) == _NOT_AN_OBJECT
    ]
    if len(runs) > 1:
        numbers = ", ".join(str(i) for i, _ in runs)
        problems.append(
            f"documents {numbers} are all {KIND}s (or {API_GROUP} objects); a file holds one run: "
            "put each in its own file"
        )
    elif not runs:
        problems.append(f"no {KIND} document in the file ({len(docs)} documents)")
    if problems:
        raise ManifestError(source, problems)
    ((number, run),) = runs
    manifest = parse_document(run, f"{source} (document {number})", check_domain)
    ignored = tuple(f"document {i} ({_describe(d)})" for i, d in docs if i != number)
    return Manifest(
        manifest.name,
        manifest.namespace,
        manifest.spec,
        manifest.raw,
        ignored,
        manifest.converted_from,
        manifest.notices,
    )


# ----- what a run on this machine needs ---------------------------------------------------------------

#: a model name starting like this is a path, never a Hugging Face id
_PATH_PREFIXES = ("/", "./", "../", "~", "file://")


def looks_like_path(name: str) -> bool:
    """A model name that can only be a local path (a Hugging Face id is ``org/name`` or ``name``)."""
    return name.startswith(_PATH_PREFIXES) or name in (".", "..") or name.count("/") >= 2


def _resolve(path_text: str, cwd: Path) -> Path:
    path = Path(path_text.removeprefix("file://")).expanduser()
    return path if path.is_absolute() else cwd / path


def _loads_model_here(spec: WhaleRunSpec, environ: Mapping[str, str]) -> bool:
    """Training always loads the base model here; evaluation and search do with in-process inference."""
    backend = spec.execution.inference.backend
    in_process = backend == "transformers" or (backend == "auto" and not environ.get("WHALE_INFERENCE_URL"))
    return spec.condition.trains_weights or in_process


def hub_model(spec: WhaleRunSpec, cwd: Path, environ: Mapping[str, str]) -> hub.Location | None:
    """Where spec.experiment.model.name loads from when it is a Hugging Face id (``org/name``) this machine loads: the
    local cache, the Hub, or neither (:mod:`whale.hub`; a bounded probe). None for a folder, an S3 model, a
    model only a server loads, or a legacy id without an organisation (checked when the phase loads it)."""
    name = spec.experiment.model.name
    if name.startswith("s3://") or not _loads_model_here(spec, environ) or looks_like_path(name) or "/" not in name:
        return None
    if _resolve(name, cwd).exists():
        return None
    return hub.locate(
        name,
        environ,
        revision=spec.experiment.model.revision,
        filename=spec.experiment.model.gguf_file or "config.json",
    )


def model_problems(spec: WhaleRunSpec, cwd: Path, environ: Mapping[str, str], *, hub_check: bool = True) -> list[str]:
    name = spec.experiment.model.name
    if name.startswith("s3://") or not _loads_model_here(spec, environ):
        return []
    path = _resolve(name, cwd)
    if not path.exists():
        if not looks_like_path(name):  # a Hugging Face id: in the local cache, or on a Hub that answers
            location = hub_model(spec, cwd, environ) if hub_check else None
            problem = location.problem() if location else None
            return [problem] if problem else []
        return [
            f"spec.experiment.model.name: {name} does not exist (relative paths are from the current folder, {cwd}); "
            "create the model folder (config.json, weights, tokenizer) or give a Hugging Face model id"
        ]
    if spec.experiment.model.gguf_file:
        gguf = path / spec.experiment.model.gguf_file
        if not gguf.is_file():
            return [
                f"spec.experiment.model.ggufFile: {gguf} does not exist; name a .gguf file inside spec.experiment.model.name"
            ]
        return []
    if not path.is_dir() or not (path / "config.json").is_file():
        return [
            f"spec.experiment.model.name: {path} is not a model folder (no config.json in it); point it at a saved "
            "Hugging Face model (config.json, weights, tokenizer) or give a model id"
        ]
    return []


#: the largest config.json read for the architecture check (real ones are a few KiB)
MAX_MODEL_CONFIG_BYTES = 1024 * 1024


def model_architecture(spec: WhaleRunSpec, cwd: Path, environ: Mapping[str, str]) -> tuple[Architecture | None, str]:
    """The architecture of ``spec.experiment.model`` from its ``config.json`` on this machine (a local model folder, or the
    local Hugging Face cache; never the network), and where it was read; or None and why not."""
    name = spec.experiment.model.name
    if spec.experiment.model.gguf_file:
        return None, "a GGUF model's architecture is read from the file when the phase loads it"
    if name.startswith("s3://"):
        return None, "a model in the store is read when the phase loads it"
    path = _resolve(name, cwd)
    if path.is_dir():
        config_path = path / "config.json"
    elif looks_like_path(name) or "/" not in name:
        return None, f"{name} is not a model folder here"
    else:
        found = hub.cached(name, environ, revision=spec.experiment.model.revision)
        if found is None:
            return None, f"{name}'s config.json is not in the local Hugging Face cache"
        config_path = found
    try:
        if config_path.stat().st_size > MAX_MODEL_CONFIG_BYTES:
            return None, f"{config_path} is larger than {MAX_MODEL_CONFIG_BYTES // 1024} KiB"
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"cannot read {config_path} ({exc})"
    if not isinstance(config, dict):
        return None, f"{config_path} is not a JSON object"
    return Architecture.from_config(config), str(config_path)


def architecture_problems(spec: WhaleRunSpec, cwd: Path, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, notes): the ``spec.experiment.rsft`` settings the model's architecture refuses
    (:func:`whale.rsft.architecture.training_problems`: they cannot run, or would leak between packed
    sequences, on any machine), and what was read or why nothing could be (the train workload then checks
    the same before it loads any weights)."""
    if not (spec.condition.trains_weights and spec.experiment.rsft.pack_sequences):
        return [], []  # padded micro-batches are exact for every architecture: nothing to check
    try:
        arch, where = model_architecture(spec, cwd, environ)
    except OSError as exc:  # a name too long for the file system, a loop of links: said, never a traceback
        arch, where = None, f"cannot read the model's path ({exc.strerror or exc})"
    if arch is None:
        return [], [f"model architecture not checked: {where}; the train workload checks it before loading weights"]
    problems = training_problems(arch, pack_sequences=spec.experiment.rsft.pack_sequences)
    return problems, [f"model architecture: {arch.describe()} ({where})"]


def replay_script_problems(spec: WhaleRunSpec, cwd: Path) -> list[str]:
    proposer = spec.experiment.harness_search.proposer
    if proposer.backend != "replay" or not spec.condition.searches_harness or not proposer.script:
        return []
    field_name = "spec.experiment.harnessSearch.proposer.script"
    path = _resolve(proposer.script, cwd)
    if not path.is_file():
        return [
            f"{field_name}: {proposer.script} does not exist (relative paths are from the current folder, {cwd}); "
            'give the recorded proposal script ({"iterations": {"2": [...]}})'
        ]
    if path.stat().st_size > MAX_MANIFEST_BYTES * 16:
        return [
            f"{field_name}: {path} is larger than {MAX_MANIFEST_BYTES * 16 // (1024 * 1024)} MiB; "
            "a replay script holds a few candidates"
        ]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [f"{field_name}: cannot read {path} as JSON: {exc}"]
    except RecursionError:
        return [f"{field_name}: {path} is nested too deeply to read; a replay script is a few levels deep"]
    iterations = data.get("iterations") if isinstance(data, dict) else None
    if not isinstance(iterations, dict):
        return [f'{field_name}: {path} must be {{"iterations": {{"2": [...]}}}} (candidates per iteration)']
    problems = []
    for it, entries in iterations.items():
        for n, entry in enumerate(entries if isinstance(entries, list) else [], start=1):
            if isinstance(entry, dict) and isinstance(entry.get("file"), str):
                candidate = path.parent / entry["file"]
                if not candidate.is_file():
                    problems.append(
                        f"{field_name}: iteration {it} candidate {n} names file {entry['file']}, which "
                        f"does not exist ({candidate}; files are relative to the script)"
                    )
    return problems


def data_dir_problems(spec: WhaleRunSpec, cwd: Path, environ: Mapping[str, str]) -> list[str]:
    """A data root that is named (spec.experiment.data.dataDir or $WHALE_DATA_DIR) must be a folder this machine can
    read; an unnamed one is the default, which the domain's split sizes then check."""
    if spec.experiment.data.data_dir:
        where, text = "spec.experiment.data.dataDir", spec.experiment.data.data_dir
    elif environ.get("WHALE_DATA_DIR"):
        where, text = "spec.experiment.data.dataDir (unset; $WHALE_DATA_DIR)", environ["WHALE_DATA_DIR"]
    else:
        return []
    path = _resolve(text, cwd)
    if not path.is_dir():
        return [
            f"{where}: {text} is not a folder on this machine; point it at a data root laid out as the "
            "shipped sample (whale/data/sample/README.md), or unset it for that sample"
        ]
    if not os.access(path, os.R_OK | os.X_OK):
        return [f"{where}: {path} is not readable by this user; fix its permissions or use another data root"]
    return []


def spec_warnings(spec: WhaleRunSpec, split_sizes: Mapping[str, int]) -> list[str]:
    """What `whale validate`, `whale plan` and `whale run` print before anything else: the settings that lift
    a wall (acknowledged, or the spec would not have loaded) and a budget the schedule does not reach."""
    from whale.core.schedule import plan

    out = []
    if spec.execution.sandbox.isolation == "none":
        out.append(
            "spec.execution.sandbox.isolation: none (acknowledged): harness files and model-written code run WITHOUT "
            "isolation and can read what this run can; trusted local use only"
        )
    if spec.experiment.harness_search.integrity.action == "off":  # every condition: training and evaluation use it too
        out.append(
            "spec.experiment.harnessSearch.integrity.action: off (acknowledged): answers the model did not write keep their "
            "reward and no candidate or evaluation is flagged; the run's numbers can be faked by its harnesses"
        )
    out += [str(w) for w in plan(spec, dict(split_sizes)).get("warnings", [])]
    return out


def _guarded(field_name: str, check: Any, *args: Any) -> list[str]:
    """``check(*args)``, with an OS error on the way (a name too long for the file system, a loop of links,
    no permission) reported as a problem of ``field_name``, never a traceback."""
    try:
        return list(check(*args))
    except OSError as exc:
        where = f" ({_short(exc.filename, 80)})" if exc.filename else ""
        return [f"{field_name}: cannot check the path{where}: {exc.strerror or exc}"]


#: where a ``cli`` proposer's ``readPaths`` may never point: folders that hold credentials or the project's
#: data (the agent is untrusted; what it can read it can copy into a harness file or its reply)
_SECRET_HOME_DIRS = (".ssh", ".aws", ".kube", ".config", ".docker", ".gnupg", ".netrc", ".git-credentials")
_SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/run", "/boot")
#: folders that hold others' files: refused themselves and as an ancestor, not what lies inside them
_HOME_ROOTS = ("/home", "/root", "/tmp", "/var")


def read_path_problems(spec: WhaleRunSpec, cwd: Path, environ: Mapping[str, str]) -> list[str]:
    """A ``cli`` proposer's ``readPaths`` (its own install, mounted read-only into its sandbox) must not show it
    the data root (gold answers, the test split), the checkout, a home folder or its credential folders, or
    a system folder: each entry must be a folder of its own that holds none of them and is inside none of
    them (a home's ``~/.local/share/claude`` is fine; ``~`` is not)."""
    proposer = spec.experiment.harness_search.proposer
    if proposer.backend != "cli" or not spec.condition.searches_harness:
        return []
    home = Path(environ.get("HOME") or Path.home()).resolve()
    from whale.domain import default_data_root

    data = [text for text in (spec.experiment.data.data_dir, environ.get("WHALE_DATA_DIR")) if text] or [
        str(default_data_root())
    ]
    checkout = Path(__file__).resolve().parent.parent
    # overlapping either way: the entry holds it, or lies inside it
    protected = [_resolve(text, cwd).resolve() for text in data] + [checkout]
    protected += [home / name for name in _SECRET_HOME_DIRS] + [Path(d) for d in _SYSTEM_DIRS]
    # holding it is refused; inside it is fine (an install under ~/.local)
    containers = [home, *(Path(d) for d in _HOME_ROOTS)]
    out = []
    for i, text in enumerate(proposer.read_paths):
        path = _resolve(text, cwd).resolve()
        field_name = f"spec.experiment.harnessSearch.proposer.readPaths[{i}]"
        clash = next((p for p in protected if p == path or p.is_relative_to(path) or path.is_relative_to(p)), None)
        if clash is None:
            clash = next((p for p in containers if p == path or p.is_relative_to(path)), None)
        if clash is not None:
            out.append(
                f"{field_name}: {text} would show the untrusted agent {clash} (data, the checkout, a home folder, "
                "credentials or a system folder); name only the agent's own install (e.g. /opt/claude-code)"
            )
    return out


def local_problems(
    manifest: Manifest, cwd: Path | None = None, environ: Mapping[str, str] | None = None, *, hub_check: bool = True
) -> list[str]:
    """What a run on this machine needs that the schema cannot check, each problem naming its field and the
    fix: the local model folder, the replay script, the data root. `whale run` refuses to start on any;
    `whale validate` reports them (as notes for a manifest meant for a cluster, whose paths are the
    image's). The proposer's key variable is `whale run`'s own check (``proposer.environment_problems``):
    validating a manifest needs no secret. ``hub_check``: also ask where a Hugging Face model id loads from
    (off for a manifest meant for a cluster, whose pods load the model)."""
    cwd = Path.cwd() if cwd is None else cwd
    env = os.environ if environ is None else environ
    spec = manifest.spec
    problems = _guarded("spec.experiment.model.name", lambda: model_problems(spec, cwd, env, hub_check=hub_check))
    problems += _guarded("spec.experiment.harnessSearch.proposer.script", replay_script_problems, spec, cwd)
    problems += _guarded("spec.experiment.data.dataDir", data_dir_problems, spec, cwd, env)
    problems += _guarded("spec.experiment.harnessSearch.proposer.readPaths", read_path_problems, spec, cwd, env)
    if spec.execution.sandbox.isolation == "pod":  # the harness pod exists only on a cluster: fail closed here
        from whale.harness.launch import POD_WITHOUT_HOST

        problems.append(POD_WITHOUT_HOST)
    return problems
