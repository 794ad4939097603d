"""What the operator accepts and how it is set up: the spec check a WhaleRun must pass before any
child exists, and the settings of one operator process (read from the environment once, at start-up)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from whale.metaharness import proposer
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.sandboxing import SandboxHostPolicy
from whale_operator.tenancy import StorePolicy


class SpecError(ValueError):
    """The WhaleRun cannot be run as written; ``field`` names the offending field."""

    def __init__(self, field_: str, message: str):
        self.field = field_
        super().__init__(f"{field_}: {message}")


def describe_validation_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) of the first error, in the manifest's camelCase."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
    return (f"spec.{loc}" if loc else "spec"), err.get("msg", str(exc))


def parse_spec(body_spec: dict[str, Any] | None) -> ClusterRunSpec:
    try:
        spec = ClusterRunSpec.model_validate(body_spec or {})
    except ValidationError as exc:
        raise SpecError(*describe_validation_error(exc)) from None
    for problem in proposer.spec_problems(spec):  # no endpoint, model or key: refused before any Job or GPU
        raise SpecError(problem.field, problem.message)
    if not spec.execution.storage.uri:
        raise SpecError(
            "spec.execution.storage.uri", "the operator needs an object store: set it to s3://bucket[/prefix]"
        )
    if spec.execution.storage.uri.startswith("s3://") and not spec.execution.storage.endpoint:
        raise SpecError(
            "spec.execution.storage.endpoint", "an s3:// store needs the S3 endpoint (host:port of MinIO/S3)"
        )
    return spec


def store_uri(spec: ClusterRunSpec) -> str:
    """The run's store (after ``tenancy.scoped``); :func:`parse_spec` has refused a spec without one."""
    if spec.execution.storage.uri is None:
        raise SpecError(
            "spec.execution.storage.uri", "the operator needs an object store: set it to s3://bucket[/prefix]"
        )
    return spec.execution.storage.uri


@dataclass(frozen=True)
class StoreBounds:
    """How long one store call of the operator may take: a reconcile holds a worker thread while it waits, and a
    tenant names the endpoint (one that accepts and never answers must not hold the operator). Tighter than the
    workloads' defaults (10 s / 120 s / 60 s): the operator reads and writes small JSON objects only."""

    #: seconds to open a connection (``WHALE_OPERATOR_STORE_CONNECT_TIMEOUT_S``)
    connect_timeout_s: float = 5.0
    #: seconds to wait for each answer (``WHALE_OPERATOR_STORE_READ_TIMEOUT_S``)
    read_timeout_s: float = 20.0
    #: seconds of retries of one call before the run shows StoreUnavailable (``WHALE_OPERATOR_STORE_DEADLINE_S``)
    retry_deadline_s: float = 20.0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> StoreBounds:
        return cls(**durations(env, _BOUND_VARS, cls()))

    def store_options(self) -> dict[str, float]:
        """The options of an s3:// ``open_store`` that bound each call."""
        return {
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "retry_deadline_s": self.retry_deadline_s,
        }


_BOUND_VARS = {
    "connect_timeout_s": "WHALE_OPERATOR_STORE_CONNECT_TIMEOUT_S",
    "read_timeout_s": "WHALE_OPERATOR_STORE_READ_TIMEOUT_S",
    "retry_deadline_s": "WHALE_OPERATOR_STORE_DEADLINE_S",
}


#: may the operator open a run's s3:// store with its OWN credentials when the run names no Secret?
OWN_STORE_CREDENTIALS_ENV = "WHALE_OPERATOR_OWN_STORE_CREDENTIALS"
SECRET_RECHECK_ENV = "WHALE_OPERATOR_SECRET_RECHECK_S"
DEFAULT_SECRET_RECHECK_S = 30.0


def seconds_setting(env: Mapping[str, str], var: str, default: float, *, zero: bool = False) -> float:
    """A duration setting of the operator's environment: a finite number of seconds above 0 (0 too with ``zero``),
    ``default`` when unset or empty. Anything else (not a number, negative, ``inf``, ``nan``: a timeout that never
    ends, a loop that never waits) is refused, naming the variable and what to give."""
    value = env.get(var, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (math.isfinite(seconds) and (seconds >= 0 if zero else seconds > 0)):
        least = "0 or more" if zero else "above 0"
        raise ValueError(f"{var}={value!r}: give a number of seconds, {least} ({default:g} when unset)")
    return seconds


def durations(env: Mapping[str, str], variables: Mapping[str, str], defaults: object) -> dict[str, float]:
    """The duration fields named in ``variables`` (field → its environment variable), each :func:`seconds_setting`
    of its variable, ``defaults``' value when unset."""
    return {name: seconds_setting(env, var, getattr(defaults, name)) for name, var in variables.items()}


def secret_recheck_s(env: dict[str, str]) -> float:
    """``WHALE_OPERATOR_SECRET_RECHECK_S`` (seconds, 0 or more; 30 when unset)."""
    return seconds_setting(env, SECRET_RECHECK_ENV, DEFAULT_SECRET_RECHECK_S, zero=True)


@dataclass(frozen=True)
class DaemonTimings:
    """When a run's daemon reconciles without being woken (``WHALE_OPERATOR_*_S``; each a number of seconds above 0)."""

    #: safety-net resync of each run when nothing woke it (``WHALE_OPERATOR_RESYNC_S``)
    resync_s: float = 30.0
    #: how often a run with a running main phase re-reads its metrics (adaptive patience, progress); store writes raise
    #: no Kubernetes events, so this is a poll (``WHALE_OPERATOR_PROGRESS_S``)
    progress_s: float = 15.0
    #: back-off after a reconcile raised or the API server refused a child (``WHALE_OPERATOR_ERROR_BACKOFF_S``), doubled
    #: after each failure in a row up to ``max_backoff_s`` (``WHALE_OPERATOR_MAX_BACKOFF_S``)
    error_backoff_s: float = 5.0
    max_backoff_s: float = 300.0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> DaemonTimings:
        return cls(**durations(env, _TIMING_VARS, cls()))


_TIMING_VARS = {
    "resync_s": "WHALE_OPERATOR_RESYNC_S",
    "progress_s": "WHALE_OPERATOR_PROGRESS_S",
    "error_backoff_s": "WHALE_OPERATOR_ERROR_BACKOFF_S",
    "max_backoff_s": "WHALE_OPERATOR_MAX_BACKOFF_S",
}


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


@dataclass
class OperatorConfig:
    """Settings of one operator process (from the environment at start-up, never read deep inside)."""

    #: extra options for ``open_store`` (credentials of the operator itself): used only for a run that names no
    #: ``spec.execution.storage.credentialsSecret``, and for an s3:// store only when ``own_store_credentials`` allows it
    store_options: dict[str, Any] = field(default_factory=dict)
    #: a run whose s3:// store names no credentials Secret is opened with the operator's own credentials
    #: (``WHALE_OPERATOR_OWN_STORE_CREDENTIALS=1``: a single-tenant install, the dev overlay). Off by default: on a
    #: shared cluster every run reaches its store with its own namespace's Secret, never with the operator's keys.
    #: A ``file://`` store needs no credentials and is always allowed.
    own_store_credentials: bool = False
    #: resolve split sizes with the domain plugin in the operator when the store has none, instead of
    #: a prepare Job (needs the data in the operator's reach; ``WHALE_OPERATOR_DOMAIN_SPLIT_SIZES=1``)
    domain_split_sizes: bool = False
    #: the stores and S3 endpoints a WhaleRun may name (``WHALE_ALLOWED_STORES`` / ``WHALE_ALLOWED_S3_ENDPOINTS``)
    store_policy: StorePolicy = field(default_factory=StorePolicy)
    #: where runs may get privileged sandbox hosts, and the admin's sandboxed RuntimeClass
    #: (``WHALE_SANDBOX_HOST_NAMESPACES`` / ``WHALE_SANDBOX_RUNTIME_CLASS``; none / none: every pod restricted)
    sandbox_hosts: SandboxHostPolicy = field(default_factory=SandboxHostPolicy)
    #: the timeouts and retry budget of every store call the operator makes (:class:`StoreBounds`)
    store_bounds: StoreBounds = field(default_factory=StoreBounds)
    #: how long a run's credentials Secret, once read, is used before it is read again
    #: (``WHALE_OPERATOR_SECRET_RECHECK_S``): a rotated Secret is taken in within this time, or at once when the store
    #: refuses the keys held. 0: read at every reconcile (a request to the API server each)
    secret_recheck_s: float = DEFAULT_SECRET_RECHECK_S
    #: the runs' daemons' resync, progress poll and back-off (:class:`DaemonTimings`)
    timings: DaemonTimings = field(default_factory=DaemonTimings)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        env = dict(os.environ if env is None else env)
        opts: dict[str, Any] = {}
        if env.get("AWS_ACCESS_KEY_ID"):
            opts["access_key"] = env["AWS_ACCESS_KEY_ID"]
        if env.get("AWS_SECRET_ACCESS_KEY"):
            opts["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        return cls(
            store_options=opts,
            domain_split_sizes=env.get("WHALE_OPERATOR_DOMAIN_SPLIT_SIZES", "").lower() in ("1", "true"),
            store_policy=StorePolicy.from_env(env),
            sandbox_hosts=SandboxHostPolicy.from_env(env),
            own_store_credentials=_flag(env.get(OWN_STORE_CREDENTIALS_ENV)),
            store_bounds=StoreBounds.from_env(env),
            secret_recheck_s=secret_recheck_s(env),
            timings=DaemonTimings.from_env(env),
        )

    def credentials_problems(self, spec: ClusterRunSpec) -> list[tuple[str, str]]:
        """(field, message) when the run's store would need credentials this operator may not lend it."""
        s = spec.execution.storage
        if s.uri and s.uri.startswith("s3://") and not s.credentials_secret and not self.own_store_credentials:
            return [
                (
                    "spec.execution.storage.credentialsSecret",
                    "an s3:// store needs the Secret holding its keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) in "
                    "the run's namespace: name it here. This operator does not lend its own credentials to runs "
                    f"({OWN_STORE_CREDENTIALS_ENV} is off)",
                )
            ]
        return []


def judge_key_problems(spec: ClusterRunSpec, scores_with_judge: bool) -> list[tuple[str, str]]:
    """(field, message) when a cluster run scores with an LLM judge (its domain's options say so) that needs a key
    but names no Secret to take it from: its workloads would stop at their first episode, so the run is refused
    before any Job exists."""
    judge = spec.experiment.verifier.judge
    if scores_with_judge and judge.api_key_env and judge.api_key_secret is None:
        return [
            (
                "spec.experiment.verifier.judge.apiKeySecret",
                f"the judge's key (${judge.api_key_env}) comes from a Secret on a cluster: name it here as "
                "{name, key} (the operator injects it into the pods that score), or set apiKeyEnv: null for an "
                "endpoint without a key",
            )
        ]
    return []


#: worker threads that run reconciles (``WHALE_OPERATOR_WORKERS``); the API client keeps as many connections
DEFAULT_WORKERS = 16
#: a thread holds a stack and a connection to the API server: thousands of them would only queue on one interpreter lock
MAX_WORKERS = 256


def worker_threads(env: dict[str, str] | None = None) -> int:
    """Reconciles are I/O-bound (API server, object store): more threads than cores, so runs do not queue behind
    each other's network waits; the Kubernetes client's connection pool has one connection per thread."""
    return whole_setting(os.environ if env is None else env, "WHALE_OPERATOR_WORKERS", DEFAULT_WORKERS, 1, MAX_WORKERS)


def whole_setting(env: Mapping[str, str], var: str, default: int, least: int, most: int) -> int:
    """A whole-number setting of the operator's environment, from ``least`` to ``most``; ``default`` when unset or
    empty. Anything else is refused, naming the variable and what to give."""
    value = env.get(var, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if not least <= number <= most:
        raise ValueError(f"{var}={value!r}: give a whole number from {least} to {most} ({default} when unset)")
    return number


def backoff_s(failures: int, first_s: float, cap_s: float) -> float:
    """The wait before retry number ``failures`` (1, 2, ...): ``first_s`` doubled each time, at most ``cap_s``."""
    return min(cap_s, first_s * 2 ** min(max(failures - 1, 0), 30))
