"""What a domain plugin supplies, and all of whale a domain may use. The core never names a domain.

A domain package registers an instance (or subclass) of :class:`Domain` under the ``whale.domains``
entry-point group. The harness runtime (``whale.harness``) extends what it needs from the domain:
its environment and tools, its verifier, its base harness h0 and the proposer's ``SKILL.md``.

This module is a domain's whole view of whale (docs/domains.md; import-linter holds domains to it):
besides the classes below it re-exports the few services a domain builds on — the store-key helper
(:func:`data_prefix`), the full-data types, the shared retriever and code runner and their clients —
imported on first use, so loading a domain stays cheap. A harness file (h0) imports only
``whale.harness.api``.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import gzip
import hashlib
import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:
    # the types a domain's signatures use, and the services re-exported below (see __getattr__)
    from whale.core.layout import data_prefix
    from whale.core.spec import Data, Verifier
    from whale.data.full import FullData, FullDataError, Source
    from whale.data.full import load_split as load_full_split
    from whale.sandbox.policy import tool_isolation
    from whale.store import Store
    from whale.tools import retrieval_index as retrieval
    from whale.tools.client import RetrieverClient, code_runner_from_env, retriever_from_env
    from whale.tools.code import CodeRunner
    from whale.tools.prepare_index import ensure_published_wiki18
    from whale.tools.retrieval_index import Hit, Retriever, default_cache_dir

#: name -> (module, attribute; None: the module itself): what a domain may use beyond this file
_SERVICES: dict[str, tuple[str, str | None]] = {
    # the types of a domain's method signatures
    "Data": ("whale.core.spec", "Data"),
    "Verifier": ("whale.core.spec", "Verifier"),
    "Store": ("whale.store", "Store"),
    # the store-key prefix of a domain's prepared data (splits, a retriever's corpus and index)
    "data_prefix": ("whale.core.layout", "data_prefix"),
    # spec.experiment.data.source: full (Domain.full_data)
    "FullData": ("whale.data.full", "FullData"),
    "FullDataError": ("whale.data.full", "FullDataError"),
    "Source": ("whale.data.full", "Source"),
    "load_full_split": ("whale.data.full", "load_split"),
    # the shared retriever (search_qa) and its service's client
    "retrieval": ("whale.tools.retrieval_index", None),
    "Hit": ("whale.tools.retrieval_index", "Hit"),
    "Retriever": ("whale.tools.retrieval_index", "Retriever"),
    "default_cache_dir": ("whale.tools.retrieval_index", "default_cache_dir"),
    "ensure_published_wiki18": ("whale.tools.prepare_index", "ensure_published_wiki18"),
    "RetrieverClient": ("whale.tools.client", "RetrieverClient"),
    "retriever_from_env": ("whale.tools.client", "retriever_from_env"),
    # the shared code runner (math_reasoning's interpreter) and the isolation spec.execution.sandbox asks for
    "CodeRunner": ("whale.tools.code", "CodeRunner"),
    "code_runner_from_env": ("whale.tools.client", "code_runner_from_env"),
    "tool_isolation": ("whale.sandbox.policy", "tool_isolation"),
}


def __getattr__(name: str) -> Any:
    """The services of :data:`_SERVICES`, imported on first use (a domain's import must not pull in
    faiss, httpx or torch)."""
    try:
        module, attr = _SERVICES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    loaded = importlib.import_module(module)
    value = loaded if attr is None else getattr(loaded, attr)
    globals()[name] = value
    return value


__all__ = [  # the plugin API (docs/domains.md)
    "DEFAULT_ALLOWED_IMPORTS",
    "ENV_SERVICE_URL_ENV",
    "SAMPLE_DATA_ROOT",
    "SPLITS",
    "CodeRunner",
    "Data",
    "Domain",
    "DomainError",
    "DomainOptions",
    "DomainOptionsError",
    "Environment",
    "FullData",
    "FullDataError",
    "Hit",
    "NoOptions",
    "Retriever",
    "RetrieverClient",
    "Source",
    "SplitsInMemoryDomain",
    "StepResult",
    "Store",
    "ToolService",
    "UnknownToolError",
    "Verifier",
    "code_runner_from_env",
    "data_prefix",
    "data_root",
    "default_cache_dir",
    "default_data_root",
    "ensure_published_wiki18",
    "env_items_key",
    "env_service",
    "for_run",
    "load_full_split",
    "open_raw",
    "raw_exists",
    "raw_file",
    "read_raw_jsonl",
    "retrieval",
    "retriever_from_env",
    "tool_isolation",
    "unpacked_raw_file",
]

SPLITS = ("weight", "harness", "test")


#: the sample data shipped inside the package (README.md there: sources, commits, licences, processing)
SAMPLE_DATA_ROOT = Path(__file__).resolve().parent / "data" / "sample"
#: a raw data file may be shipped gzipped beside its name (``rows.jsonl`` as ``rows.jsonl.gz``)
PACKED_SUFFIX = ".gz"


def default_data_root() -> Path:
    """$WHALE_DATA_DIR, else the sample data shipped with the package (``whale/data/sample``)."""
    env = os.environ.get("WHALE_DATA_DIR")
    return Path(env) if env else SAMPLE_DATA_ROOT


def data_root(data: Data) -> Path:
    return Path(data.data_dir) if data.data_dir else default_data_root()


def raw_file(path: Path) -> Path:
    """The file that holds a raw data file's rows: ``path`` itself, else its gzipped copy ``path.gz`` (the
    shipped sample gzips its large files), else ``path`` (absent: the caller's error names it)."""
    path = Path(path)
    packed = path.with_name(path.name + PACKED_SUFFIX)
    return packed if not path.is_file() and packed.is_file() else path


def raw_exists(path: Path) -> bool:
    """``path`` or its gzipped copy is a file."""
    return raw_file(path).is_file()


def open_raw(path: Path) -> IO[str]:
    """A raw data file opened as UTF-8 text, gzipped or not (:func:`raw_file`)."""
    found = raw_file(path)
    if found.name.endswith(PACKED_SUFFIX):
        return gzip.open(found, "rt", encoding="utf-8")
    return found.open(encoding="utf-8")


def unpacked_raw_file(path: Path) -> Path:
    """A plain copy of a raw data file, for readers that seek (the retrieval corpus): ``path`` itself when it
    is plain, else its ``.gz`` decompressed once into ``$WHALE_CACHE_DIR/data/<digest>/`` (written atomically;
    keyed by the packed file's SHA-256, so a changed file is unpacked again)."""
    found = raw_file(path)
    if not found.name.endswith(PACKED_SUFFIX):
        return found
    from whale.tools.retrieval_index import default_cache_dir, file_digest

    target = default_cache_dir().parent / "data" / file_digest(found)[:16] / found.name.removesuffix(PACKED_SUFFIX)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(found, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


#: the paper's allow list for chess harness files (no engine, no search library)
DEFAULT_ALLOWED_IMPORTS = frozenset({"collections", "itertools", "math", "random", "re", "statistics"})


class DomainError(ValueError):
    """Bad domain input (an item, an action, a tool call); the message names the item/field and the fix."""


def read_raw_jsonl(path: Path, subdir: str, error: type[DomainError] = DomainError) -> list[dict[str, Any]]:
    """The rows of a raw JSON-lines data file under the data root's ``subdir`` (plain or gzipped,
    :func:`raw_file`); a missing or broken file raises ``error`` (a :class:`DomainError`) naming the file,
    the line and the fix."""
    if not raw_exists(path):
        raise error(
            f"{path}: missing. Point spec.experiment.data.dataDir (or $WHALE_DATA_DIR) at a data root that holds "
            f"{subdir}/, or unset both for the sample data shipped with whale ({SAMPLE_DATA_ROOT})"
        )
    rows = []
    with open_raw(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise error(f"{raw_file(path)}:{n}: not valid JSON ({exc.msg})") from exc
    return rows


class UnknownToolError(DomainError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(f"unknown tool {name!r}; this domain offers: {', '.join(known) or '(no tools)'}")


@dataclasses.dataclass
class StepResult:
    """What :meth:`Environment.step` returns. ``observation`` goes to the harness's ``observe`` hook."""

    #: JSON dict shown to the harness (e.g. chess: fen, board, legal moves, last reply, an ``error``)
    observation: dict[str, Any]
    #: the episode is over (solved, failed, answered); the runtime stops and asks for the reward
    done: bool = False
    #: JSON extras recorded in the trace only (never shown to the harness)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the answer this step submits for grading, as the verifier reads it, in each spelling it accepts
    #: (math: the boxed content; chess: the move's UCI and SAN); empty: the step grades nothing. The
    #: runtime scores 0 an episode whose graded answer no model reply contains (whale.harness.provenance)
    graded: tuple[str, ...] = ()

    def harness_result(self) -> dict[str, Any]:
        """What a harness's ``observe`` gets for this step: ``{"kind": "env", "observation", "done"}`` (never
        ``info`` or ``graded``). One rule for the episode runner and the environment service
        (``whale.tools.env_service``); ValueError when the observation is not JSON (a domain bug)."""
        try:
            observation = json.loads(json.dumps(self.observation))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the environment returned a value that is not JSON: {exc}") from exc
        return {"kind": "env", "observation": observation, "done": bool(self.done)}


class Environment(abc.ABC):
    """One episode's world: trusted domain code running in the runtime process.

    Created by :meth:`Domain.make_env` for one item and one sample; never shared between episodes.
    ``reset``/``step``/``reward`` run on the event loop, so they must be fast and do no blocking
    I/O; ``call_tool`` runs in a worker thread and may block (HTTP to a retriever, a code sandbox).
    An invalid action (malformed, illegal) is not an exception: return an observation that says so
    (e.g. ``{"error": "illegal move e2e5", ...}``) with ``done=False`` and leave the state unchanged,
    so the harness can decide to retry; raise only for bugs.
    """

    @abc.abstractmethod
    def reset(self) -> dict[str, Any]:
        """The task as a JSON dict: the fields the harness's ``USER_TEMPLATE`` may use."""

    @abc.abstractmethod
    def step(self, action: Any) -> StepResult:
        """Apply one environment action (the ``action`` of ``{"kind": "env", "action": ...}``)."""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool; the returned text becomes the tool result's ``content``. Raise
        :class:`DomainError` for bad arguments (the harness sees the message as ``error``)."""
        raise UnknownToolError(name, [])

    @abc.abstractmethod
    def reward(self) -> float:
        """The verifier on the final state (called once, after the episode ends, also after a turn
        budget or harness stop): 1.0 solved, 0.0 not; values in [0, 1]."""

    def gold_answers(self) -> tuple[str, ...]:
        """The item's gold answers as text, for the runtime's answer-injection check (never sent to the
        harness; ``whale.harness.provenance``). Default: none (no injection check)."""
        return ()

    def close(self) -> None:
        """Free per-episode resources. Called once after :meth:`reward`."""


@dataclasses.dataclass(frozen=True)
class ToolService:
    """A long-lived service a domain's environments call on a cluster (one Deployment + Service per
    run, built by the operator from this description; locally the domain runs the tool in-process).

    ``fetch`` lists store files the service needs before it starts, as (key relative to the domain's
    ``whale.core.layout.data_prefix``, command-line flag): each is downloaded into the pod and its local
    path passed after the flag (the retriever's corpus). A key ending in ``/`` is a folder, fetched
    whole once its ``COMPLETE`` marker exists (a prepared index); the domain's :meth:`Domain.prepare_store`
    puts these objects in the store during the run's preparation."""

    #: names the Deployment/Service (``<run>-<name>``) and the pod's container
    name: str
    #: ``python -m <module> --host 0.0.0.0 --port <port> ...``
    module: str
    #: the variable the workloads read for the service's base URL (``whale.tools.client``)
    url_env: str
    port: int = 8080
    #: runs untrusted model-written code: hardened pod, no credentials, deny-all NetworkPolicy
    sandboxed: bool = False
    #: extra arguments after ``--host``/``--port``
    args: tuple[str, ...] = ()
    fetch: tuple[tuple[str, str], ...] = ()
    #: container resource requests, e.g. (("memory", "96Gi"),); empty: the operator's default for the kind
    requests: tuple[tuple[str, str], ...] = ()
    #: the flag the policy model's tokenizer folder is passed after (the retriever's ``--tokenizer``): the operator
    #: places ``spec.experiment.model``'s tokenizer in the pod first; None: the service needs none
    tokenizer_flag: str | None = None
    #: the flag ``spec.experiment.verifier`` (its JSON) is passed after (the environment service judges as the episodes do);
    #: None: the service needs none
    verifier_flag: str | None = None
    #: reached only from the run's own pods (a NetworkPolicy on its ingress; unlike ``sandboxed``, its egress stays
    #: open for the init container that fetches its files from the store)
    run_pods_only: bool = False


#: the environment service's base URL (:func:`env_service`; the prototyping kit lists it as ``env``)
ENV_SERVICE_URL_ENV = "WHALE_ENV_URL"
ENV_SERVICE_MODULE = "whale.tools.env_service"
#: the flag a service that judges (``ToolService.verifier_flag``) takes the run's ``domainOptions`` (JSON) after
DOMAIN_OPTIONS_FLAG = "--domain-options"


def env_items_key(data: Data) -> str:
    """Where the environment service's items are, under the domain's ``data_prefix``: the D_harness split of these
    data settings (:meth:`Domain.prepare_store` writes it), named by a hash of the settings."""
    tag = hashlib.sha256(json.dumps(data.to_wire(), sort_keys=True).encode("utf-8")).hexdigest()[:16]
    return f"env-service/{tag}/harness.jsonl"


def env_service(domain: str, data: Data) -> ToolService:
    """The environment service of a :attr:`Domain.prototype_steps` domain (``python -m whale.tools.env_service``):
    the domain's own environment answering a harness's steps on the run's D_harness tasks, for the proposer's
    prototyping kit. Trusted domain code on untrusted input (it runs none): a restricted pod with no credentials,
    reached only from the run's pods; it holds the D_harness items, gold included, and answers no other task."""
    return ToolService(
        name="env",
        module=ENV_SERVICE_MODULE,
        url_env=ENV_SERVICE_URL_ENV,
        args=("--domain", domain),
        fetch=((env_items_key(data), "--items"),),
        requests=(("cpu", "500m"), ("memory", "1Gi")),
        verifier_flag="--verifier",
        run_pods_only=True,
    )


class DomainOptions(BaseModel):
    """A domain's own options (``spec.experiment.domainOptions``), as its ``options.py`` declares them: camelCase
    on the wire, unknown fields refused (a typo must not be silently ignored), frozen. Defaults are the paper's."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class NoOptions(DomainOptions):
    """The options of a domain that has none."""


class DomainOptionsError(DomainError, ValueError):
    """``spec.experiment.domainOptions`` that the run's domain refuses; ``problems`` name each field and the fix."""

    def __init__(self, domain: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"domain {domain!r}: " + "; ".join(problems))


def _options_problems(domain: str, model: type[DomainOptions], exc: ValidationError) -> list[str]:
    known = ", ".join(sorted(f.alias or n for n, f in model.model_fields.items())) or "(none)"
    out = []
    for err in exc.errors()[:20]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        field = f"spec.experiment.domainOptions.{where}" if where else "spec.experiment.domainOptions"
        if err.get("type") == "extra_forbidden":
            out.append(f"{field}: not an option of domain {domain!r}; its options: {known} (docs/reference.md)")
        else:
            out.append(f"{field}: {err.get('msg')}; domain {domain!r} takes: {known}")
    return out


class Domain(abc.ABC):
    """A domain plugin: data, environment + tools, verifier, h0 harness and the proposer's skill text.

    Subclasses set ``name`` and implement the abstract methods. Items are JSON dicts with a stable
    ``"id"`` (str) and, where the domain has several benchmarks, a ``"subset"`` (str) used for
    per-subset accuracy; everything else in an item is the domain's own business.
    """

    name: ClassVar[str]

    #: top-level modules a harness file of this domain may import (besides ``whale.harness.api``)
    allowed_imports: ClassVar[frozenset[str]] = DEFAULT_ALLOWED_IMPORTS
    #: hard cap on model calls per episode, whatever a harness's MAX_TURNS says (None = no cap)
    max_turns_limit: ClassVar[int | None] = None
    #: services the environments call on a cluster (the operator deploys one of each per run)
    tool_services: ClassVar[tuple[ToolService, ...]] = ()
    #: the model of ``spec.experiment.domainOptions`` (the domain's ``options.py``); default: none
    options_model: ClassVar[type[DomainOptions]] = NoOptions
    #: this run's options (:meth:`with_options`); the model's defaults until then
    _options: DomainOptions | None = None

    @property
    def options(self) -> Any:
        """The run's domain options (an instance of :attr:`options_model`)."""
        return self._options if self._options is not None else self.options_model()

    def parse_options(self, raw: Any) -> DomainOptions:
        """``spec.experiment.domainOptions`` validated by :attr:`options_model`; raises :class:`DomainOptionsError`
        naming each bad field and the options there are."""
        try:
            return self.options_model.model_validate(raw or {})
        except ValidationError as exc:
            raise DomainOptionsError(self.name, _options_problems(self.name, self.options_model, exc)) from None

    def with_options(self, raw: Any) -> Domain:
        """This domain for a run with these ``domainOptions`` (a copy: a loaded plugin is shared, e.g. by the
        operator's runs); raises :class:`DomainOptionsError`."""
        options = self.parse_options(raw)
        if options == self.options:
            return self
        out = copy.copy(self)
        out._options = options
        return out

    def cluster_options(self, options: Any) -> Any:
        """The options a run uses on a cluster (the operator calls it; search_qa: corpus ``auto`` is the paper's
        wiki18 there). Default: as given."""
        return options

    @property
    def scores_with_judge(self) -> bool:
        """The run's options score episodes with the LLM judge (``spec.experiment.verifier.judge``); the operator
        then gives its key to the pods that score. Default: never."""
        return False

    #: the proposer may see this domain's step answers, as its model does turn by turn (chess: each move's
    #: verdict and the opponent's reply): the environment service (:data:`ENV_SERVICE`) serves them to the
    #: prototyping kit and ``try_harness`` runs them. False: a step is the final answer and its answer the grade
    #: (search, math), so a try-out's step ends the episode ungraded and no environment service is run
    prototype_steps: ClassVar[bool] = False

    def tool_services_for(self, data: Data) -> tuple[ToolService, ...]:
        """The services a run with these data settings needs (search_qa: the retriever of
        ``domainOptions.corpus``). Default: :attr:`tool_services`, and the environment service (:func:`env_service`) of a
        :attr:`prototype_steps` domain."""
        services = type(self).tool_services
        return (*services, env_service(self.name, data)) if self.prototype_steps else services

    def prepare_store(self, data: Data, store: Store) -> None:
        """Put into the run's store what :meth:`tool_services_for`'s services fetch (a retriever's corpus
        or index), under ``whale.core.layout.data_prefix``. The prepare workload calls it once per run, after
        the full data's splits and before the split sizes; it must be idempotent (a store that has them already
        is left alone). Default: the environment service's D_harness items (:func:`env_items_key`) of a
        :attr:`prototype_steps` domain, else nothing."""
        if not self.prototype_steps:
            return
        from whale.core.layout import data_prefix

        key = f"{data_prefix(self.name)}/{env_items_key(data)}"
        if not store.exists(key):
            items = self.load_split("harness", data, store)[: data.harness_size]
            store.write_text(key, "".join(json.dumps(item, sort_keys=True) + "\n" for item in items))

    def full_data(self) -> FullData | None:
        """The paper's full datasets of this domain (``spec.experiment.data.source: full``): their sources, split sizes
        and split builder (``whale.data.full``). Default: None, the domain has only its sample files."""
        return None

    def require_full_data(self) -> FullData:
        full = self.full_data()
        if full is None:
            from whale.data.full import FullDataError

            raise FullDataError(
                f"spec.experiment.data.source: domain {self.name!r} has no full data to fetch; use source: sample"
            )
        return full

    @abc.abstractmethod
    def split_sizes(self, data: Data) -> dict[str, int]:
        """|D_weight|, |D_harness|, |D_test| for these data settings. Cheap: `whale plan` calls it.
        For ``source: full`` these are the sizes the preparation produces (``FullData.sizes``), known
        before anything is fetched."""

    @abc.abstractmethod
    def load_split(self, split: str, data: Data, store: Store | None = None) -> list[dict[str, Any]]:
        """The items of ``split`` (one of :data:`SPLITS`), in a fixed order, honouring the caps in
        ``data``. ``store`` is the run's store, where a domain may cache materialised splits
        (``whale.core.layout.data_prefix``); None = local data only."""

    @abc.abstractmethod
    def make_env(self, item: dict[str, Any]) -> Environment:
        """A fresh environment for one episode on ``item``."""

    def item_from_raw(self, raw: dict[str, Any]) -> dict[str, Any]:
        """An item from the domain's raw row format (chess: a Lichess CSV row as a dict); used by
        ``whale replay``. Default: the raw dict is already an item. Raise :class:`DomainError`."""
        return raw

    @abc.abstractmethod
    def h0_path(self) -> Path:
        """The base harness file h0 (a Python file implementing ``whale.harness.api``)."""

    def h0_path_for(self, data: Data) -> Path:
        """h0 for a run with these data settings (what every phase starts from when no harness is given). Default:
        :meth:`h0_path`; a domain whose task variants (``spec.experiment.data``) ask different questions gives each its own."""
        return self.h0_path()

    @abc.abstractmethod
    def skill_path(self) -> Path:
        """The proposer's ``SKILL.md`` for this domain: what a harness may change, the allowed
        imports, one mechanism per candidate."""

    def skill_text(self, data: Data) -> str:
        """The skill the proposer reads for a run with these data settings. Default: :meth:`skill_path`'s
        text; a domain whose D_harness differs by ``data.source`` says which one the run scores on."""
        path = self.skill_path()
        return path.read_text("utf-8") if path.is_file() else ""

    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of the tools :meth:`Environment.call_tool` accepts: a harness's ``TOOLS``
        may list only these, by name, with any description (refused when it loads otherwise:
        ``whale.harness.runner.check_tools``). Default: no tools."""
        return []

    def prototype_modules(self) -> dict[str, str]:
        """Standard-library modules the proposer's prototyping kit ships beside the harness API (kit-relative
        path -> source): the code behind this domain's tools that the kit's ``tools.py`` runs, so it answers as
        :meth:`Environment.call_tool` does (search_qa: ``search_qa/tool.py``). Default: none."""
        return {}

    def subset(self, item: dict[str, Any]) -> str:
        """The benchmark an item belongs to, for per-subset accuracy."""
        return str(item.get("subset") or self.name)

    def configure_sandbox(self, isolation: str) -> None:
        """``spec.execution.sandbox.isolation`` ("namespaces" | "none") for this domain's tools that run untrusted
        code (math_reasoning's code interpreter); workloads call it once after loading the domain.
        Default: the domain has no such tool."""

    def configure_verifier(self, verifier: Verifier) -> None:
        """``spec.experiment.verifier``: the scoring services the run gives (search_qa's LLM judge, where its options
        score with it); workloads call it once after loading the domain. Default: the domain uses none."""

    def notes(self) -> list[str]:
        """What every evaluation result should say about this domain's data (e.g. a benchmark
        missing from it); the eval workload copies these into ``EvalResult.notes``."""
        return []


def for_run(domain: Any, raw_options: Any) -> Any:
    """``domain`` (a loaded plugin) with a run's ``spec.experiment.domainOptions`` (:meth:`Domain.with_options`); a
    plugin that does not subclass :class:`Domain` declares no options, so it takes none. Raises
    :class:`DomainOptionsError`."""
    if isinstance(domain, Domain):
        return domain.with_options(raw_options)
    if raw_options:
        name = getattr(domain, "name", "?")
        raise DomainOptionsError(
            name, [f"spec.experiment.domainOptions: domain {name!r} takes no options; remove domainOptions"]
        )
    return domain


class SplitsInMemoryDomain(Domain):
    """A domain whose three splits are built in memory from the raw files in one pass
    (:meth:`build_splits`); sizes and items both come from it."""

    @abc.abstractmethod
    def build_splits(self, data: Data) -> dict[str, list[dict[str, Any]]]:
        """{"weight": [...], "harness": [...], "test": [...]} for these data settings."""

    def split_sizes(self, data: Data) -> dict[str, int]:
        if data.source == "full":
            return self.require_full_data().sizes(data)
        return {name: len(rows) for name, rows in self.build_splits(data).items()}

    def load_split(self, split: str, data: Data, store: Store | None = None) -> list[dict[str, Any]]:
        if data.source == "full":  # prepared into the run's store (whale.data.full), never built here
            from whale.data import full

            return full.load_split(store, self.require_full_data(), data, split)
        splits = self.build_splits(data)
        if split not in splits:
            raise DomainError(f"unknown split {split!r}; use one of {', '.join(splits)}")
        return splits[split]
