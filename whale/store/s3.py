"""The S3 backend (MinIO, SeaweedFS, AWS S3, ...) through the ``minio`` SDK; the only importer of it.

``s3://bucket/prefix`` is the store root; a key ``k`` is the object ``prefix/k`` in ``bucket``.
Configuration comes from arguments first, then the environment (documented in docs/storage.md):

=============================  ====================================================================
``WHALE_S3_ENDPOINT``          ``host:port`` or ``http(s)://host:port`` of the S3 server (required)
``WHALE_S3_SECURE``            ``true``/``false``: HTTPS for a bare host:port (a scheme in the endpoint wins)
``WHALE_S3_REGION``            region; also ``AWS_REGION`` / ``AWS_DEFAULT_REGION``; default: asked
``AWS_ACCESS_KEY_ID``          access key (required)
``AWS_SECRET_ACCESS_KEY``      secret key (required)
``AWS_SESSION_TOKEN``          optional session token
``WHALE_S3_RETRY_DEADLINE_S``  overall retry budget per operation in seconds (default 60)
=============================  ====================================================================

Every call is bounded: each attempt waits at most ``connect_timeout_s`` (10) to connect and ``read_timeout_s``
(120) for each answer (urllib3's pool under the SDK), and the retries of one operation stop at the deadline, so
a server that accepts and never answers costs one operation at most the deadline plus one attempt.

Why the shapes below:

- Atomicity: one PUT (or a completed multipart upload) replaces an object atomically in S3, so
  ``write_bytes`` is a single PUT and readers never see half an object.
- Failure meaning lives in the exception type: connection errors, timeouts and 5xx answers are
  retried with exponential backoff until an overall deadline, then :class:`StoreUnavailable`
  names the endpoint; rejected credentials raise :class:`StoreAuthError` at once (retrying cannot
  help); a missing key is :class:`ObjectNotFound`. The SDK's own urllib3 retries are switched off
  so that this module alone owns the budget.
- A write the server refuses for good names the object: a full store or exhausted quota
  (``XMinioStorageFull``, ``QuotaExceeded``, HTTP 507, ...) is :class:`StoreFull`, AccessDenied to a
  write is :class:`StoreWriteDenied` (a :class:`StoreAuthError` too); neither is retried.
- The bucket is created on the first write when it does not exist.
- The run lock (``whale.store.lease``) is an object taken and renewed with conditional writes
  (``If-None-Match: *`` / ``If-Match: <etag>``; SeaweedFS, MinIO and AWS S3 honour both) and read back
  after each write, so a server that ignored the condition is caught.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError

from whale.store.base import (
    ObjectNotFound,
    Store,
    StoreAuthError,
    StoreError,
    StoreFull,
    StoreUnavailable,
    StoreWriteDenied,
    normalize_key,
)
from whale.store.lease import Lease, LeaseHeld, LeaseHolder, LeaseInfo, LeaseLost

log = logging.getLogger(__name__)
T = TypeVar("T")

ENV_ENDPOINT = "WHALE_S3_ENDPOINT"
ENV_SECURE = "WHALE_S3_SECURE"
ENV_REGION = "WHALE_S3_REGION"
ENV_RETRY_DEADLINE = "WHALE_S3_RETRY_DEADLINE_S"
ENV_ACCESS_KEY = "AWS_ACCESS_KEY_ID"
ENV_SECRET_KEY = "AWS_SECRET_ACCESS_KEY"
ENV_SESSION_TOKEN = "AWS_SESSION_TOKEN"

CREDENTIALS_HINT = (
    f"set {ENV_ACCESS_KEY} and {ENV_SECRET_KEY} to a valid key pair "
    "(on a cluster: the Secret named by spec.execution.storage.credentialsSecret)"
)

#: one PUT up to S3's single-request limit: in-memory writes are never split
_SINGLE_PUT_MAX = 5 * 1024**3
#: part size for streaming file uploads (multipart, completed atomically)
_FILE_PART_SIZE = 64 * 1024**2

_AUTH_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
        "InvalidSecurity",
        "AccountProblem",
        "AllAccessDisabled",
        "InvalidClientTokenId",
        "MissingSecurityHeader",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "OperationAborted",
        "XMinioServerNotInitialized",
        "ServerBusy",
        # the server saw our connection die mid-body (SeaweedFS answers a cut upload with it, when the answer
        # still gets through): the request never took effect, so it is retried like a reset connection
        "ClientDisconnected",
    }
)
#: the store (or the bucket's quota) is full: permanent until someone frees space
_FULL_CODES = frozenset(
    {
        "XMinioStorageFull",
        "QuotaExceeded",
        "XMinioAdminBucketQuotaExceeded",
        "InsufficientStorage",
        "StorageFull",
    }
)
#: a conditional write or delete whose condition did not hold
_PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchObject", "ResourceNotFound"})
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


# ----- pure pieces: configuration, URI parsing, error classification, retry policy ------------------


@dataclass(frozen=True)
class S3Config:
    """Where and as whom to connect; built by :func:`resolve_config` from arguments and environment."""

    endpoint: str  #: host:port, no scheme
    secure: bool
    access_key: str
    secret_key: str
    session_token: str | None = None
    region: str | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"

    def __repr__(self) -> str:  # never print the secret
        return f"S3Config(endpoint={self.url!r}, access_key={self.access_key!r}, region={self.region!r})"


def _env_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise StoreError(f"{name}={value!r}: use true or false")


def resolve_config(
    *,
    endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    session_token: str | None = None,
    secure: bool | None = None,
    region: str | None = None,
    env: Mapping[str, str] | None = None,
) -> S3Config:
    """Arguments win over the environment; missing required settings raise with the variable to set."""
    env = os.environ if env is None else env
    raw = endpoint or env.get(ENV_ENDPOINT, "").strip()
    if not raw:
        raise StoreError(
            f"no S3 endpoint: set {ENV_ENDPOINT}=host:port (or spec.execution.storage.endpoint in the manifest)"
        )
    scheme_secure: bool | None = None
    if "://" in raw:
        scheme, _, raw = raw.partition("://")
        if scheme not in ("http", "https"):
            raise StoreError(f"S3 endpoint {endpoint or env.get(ENV_ENDPOINT)!r}: scheme must be http or https")
        scheme_secure = scheme == "https"
    raw = raw.rstrip("/")
    if not raw or "/" in raw:
        raise StoreError(f"S3 endpoint {raw!r}: give host[:port] only (no path); the bucket goes in the s3:// URI")
    if scheme_secure is not None:  # an explicit scheme says what the server speaks; it wins
        secure = scheme_secure
    elif secure is None:
        secure = _env_bool(ENV_SECURE, env[ENV_SECURE]) if env.get(ENV_SECURE) else False
    access_key = access_key or env.get(ENV_ACCESS_KEY) or None
    secret_key = secret_key or env.get(ENV_SECRET_KEY) or None
    if not access_key or not secret_key:
        missing = " and ".join(n for n, v in ((ENV_ACCESS_KEY, access_key), (ENV_SECRET_KEY, secret_key)) if not v)
        raise StoreAuthError(f"no S3 credentials for {raw}: {missing} not set; {CREDENTIALS_HINT}")
    region = region or env.get(ENV_REGION) or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    return S3Config(
        endpoint=raw,
        secure=secure,
        access_key=access_key,
        secret_key=secret_key,
        session_token=session_token or env.get(ENV_SESSION_TOKEN) or None,
        region=region,
    )


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``, with the bucket name checked."""
    if not uri.startswith("s3://"):
        raise StoreError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise StoreError(
            f"S3 URI {uri!r}: bucket {bucket!r} is not a valid bucket name "
            "(3-63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit)"
        )
    return bucket, normalize_key(prefix, allow_root=True)


class ErrorKind:
    """How an exception from the SDK/transport is to be treated."""

    TRANSIENT = "transient"  #: retry with backoff
    AUTH = "auth"  #: credentials rejected: raise StoreAuthError, never retry
    NOT_FOUND = "not_found"
    FULL = "full"  #: no space or quota left: raise StoreFull, never retry
    PERMANENT = "permanent"  #: any other answer from the server: raise StoreError


def classify(exc: BaseException) -> str:
    if isinstance(exc, S3Error):
        if exc.code in _AUTH_CODES:
            return ErrorKind.AUTH
        if exc.code in _NOT_FOUND_CODES:
            return ErrorKind.NOT_FOUND
        status = getattr(exc.response, "status", 0) or 0
        if exc.code in _FULL_CODES or status == 507:
            return ErrorKind.FULL
        if exc.code in _TRANSIENT_CODES or status >= 500:
            return ErrorKind.TRANSIENT
        return ErrorKind.PERMANENT
    if isinstance(exc, ServerError):
        if exc.status_code == 507:
            return ErrorKind.FULL
        return ErrorKind.TRANSIENT if exc.status_code >= 500 else ErrorKind.PERMANENT
    if isinstance(exc, InvalidResponseError):
        # a proxy/load balancer answering HTML: 5xx is the server being away, 4xx a misconfiguration
        code = getattr(exc, "_code", 0) or 0
        if code in (401, 403):
            return ErrorKind.AUTH
        if code == 507:
            return ErrorKind.FULL
        return ErrorKind.TRANSIENT if code >= 500 else ErrorKind.PERMANENT
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return ErrorKind.TRANSIENT
    return ErrorKind.PERMANENT


def auth_code(exc: BaseException) -> str:
    """The known code of a refusal :func:`classify` calls AUTH (one of ``_AUTH_CODES``, or the HTTP status of a
    non-S3 answer): never text the server chose."""
    if isinstance(exc, S3Error) and exc.code in _AUTH_CODES:
        return str(exc.code)
    return f"HTTP {getattr(exc, '_code', 0) or 403}"


def describe(exc: BaseException) -> str:
    """A one-line, secret-free summary of an SDK/transport error."""
    if isinstance(exc, S3Error):
        return f"{exc.code}: {(exc.message or '').rstrip('.')}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter under an overall deadline (per store operation)."""

    initial_delay_s: float = 0.1
    multiplier: float = 2.0
    max_delay_s: float = 5.0
    deadline_s: float = 60.0
    jitter: float = 0.25  #: each delay is scaled by a factor in [1 - jitter, 1]

    def delay_s(self, attempt: int, u: float = 1.0) -> float:
        """Delay after the ``attempt``-th failure (1-based); ``u`` in [0, 1] draws the jitter."""
        base = min(self.max_delay_s, self.initial_delay_s * self.multiplier ** (attempt - 1))
        return base * (1.0 - self.jitter * (1.0 - u))


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    what: str,
    endpoint: str,
    bounds: str = "",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """Run ``fn``; retry transient failures until ``policy.deadline_s``, then raise StoreUnavailable.

    Non-transient errors are re-raised untouched for the caller to translate. A retry is only
    started if its delay still ends before the deadline, so the total time is bounded by the
    deadline plus one attempt's own timeout. ``bounds`` (the per-attempt timeouts, in words) goes into the error."""
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:  # narrowed just below: only transient errors are retried
            if classify(exc) != ErrorKind.TRANSIENT:
                raise
            elapsed = clock() - start
            delay = policy.delay_s(attempt, rand())
            if elapsed + delay > policy.deadline_s:
                raise StoreUnavailable(
                    f"S3 endpoint {endpoint} unavailable: {what} failed {attempt} time(s) over {elapsed:.1f}s "
                    f"(last error: {describe(exc)}{'; ' + bounds if bounds else ''}). Check that the server is running "
                    "and answering, and that "
                    f"{ENV_ENDPOINT} / spec.execution.storage.endpoint points at it",
                    endpoint=endpoint,
                    attempts=attempt,
                    elapsed_s=elapsed,
                ) from exc
            log.warning("S3 %s at %s failed (%s); retry %d in %.2fs", what, endpoint, describe(exc), attempt, delay)
            sleep(delay)


# ----- the backend ---------------------------------------------------------------------------------


class S3Store(Store):
    """A store rooted at ``s3://bucket/prefix``. Thread-safe (the SDK client is)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        secure: bool | None = None,
        region: str | None = None,
        retry: RetryPolicy | None = None,
        retry_deadline_s: float | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
        env: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        env = os.environ if env is None else env
        self.bucket, self.prefix = parse_s3_uri(f"s3://{bucket}/{prefix}")
        self.config = resolve_config(
            endpoint=endpoint,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            secure=secure,
            region=region,
            env=env,
        )
        if retry_deadline_s is None and env.get(ENV_RETRY_DEADLINE):
            try:
                retry_deadline_s = float(env[ENV_RETRY_DEADLINE])
            except ValueError:
                raise StoreError(f"{ENV_RETRY_DEADLINE}={env[ENV_RETRY_DEADLINE]!r}: give seconds, e.g. 60") from None
        self.retry = retry or RetryPolicy()
        if retry_deadline_s is not None:
            if retry_deadline_s < 0:
                raise StoreError(f"retry_deadline_s={retry_deadline_s}: give seconds >= 0")
            self.retry = replace(self.retry, deadline_s=float(retry_deadline_s))
        self.uri = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self._sleep = sleep
        self._bucket_ready = False
        self._bucket_lock = threading.Lock()
        self.connect_timeout_s, self.read_timeout_s = float(connect_timeout_s), float(read_timeout_s)
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
            retries=False,  # this module owns retries and their deadline
            maxsize=16,
        )
        self._client = Minio(
            self.config.endpoint,
            access_key=self.config.access_key,
            secret_key=self.config.secret_key,
            session_token=self.config.session_token,
            secure=self.config.secure,
            region=self.config.region,
            http_client=http,
        )

    #: keyword options ``open_store("s3://...", **options)`` accepts
    OPTIONS = frozenset(
        {
            "endpoint",
            "access_key",
            "secret_key",
            "session_token",
            "secure",
            "region",
            "retry",
            "retry_deadline_s",
            "connect_timeout_s",
            "read_timeout_s",
            "env",
            "sleep",
        }
    )

    @classmethod
    def from_uri(cls, uri: str, **options: Any) -> S3Store:
        unknown = sorted(set(options) - cls.OPTIONS)
        if unknown:
            raise StoreError(
                f"unknown S3 store option(s) {', '.join(unknown)}; known: {', '.join(sorted(cls.OPTIONS))}"
            )
        bucket, prefix = parse_s3_uri(uri)
        return cls(bucket, prefix, **options)

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint={self.config.url!r})"

    # --- plumbing ---
    def _name(self, key: str) -> str:
        key = normalize_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _folder(self, prefix: str) -> str:
        """The S3 listing prefix of a folder key ('' = this store's root)."""
        key = normalize_key(prefix, allow_root=True)
        full = f"{self.prefix}/{key}" if self.prefix and key else (self.prefix or key)
        return full + "/" if full else ""

    def _where(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"

    def _rel(self, name: str) -> str:
        return name[len(self.prefix) + 1 :] if self.prefix else name

    def _call(self, what: str, fn: Callable[[], T], key: str | None = None, writing: str | None = None) -> T:
        """Run one SDK operation under the retry budget and translate its failure to our types.
        ``writing``: the URI the operation writes (or deletes), named by a refused write's error."""
        try:
            return call_with_retry(
                fn,
                policy=self.retry,
                what=what,
                endpoint=self.config.url,
                bounds=f"each attempt waits at most {self.connect_timeout_s:g}s to connect and "
                f"{self.read_timeout_s:g}s for an answer",
                sleep=self._sleep,
            )
        except StoreError:
            raise
        except Exception as exc:  # translated by kind; the original stays chained
            kind = classify(exc)
            if kind == ErrorKind.NOT_FOUND and key is not None:
                raise ObjectNotFound(key, self.uri) from None
            if kind == ErrorKind.FULL:
                raise StoreFull(
                    writing or self.uri,
                    f"S3 at {self.config.url} refused it: {describe(exc)}",
                    "free space on the S3 server or raise the bucket's quota; then run the same command again "
                    "to resume",
                ) from exc
            if kind == ErrorKind.AUTH and writing is not None and getattr(exc, "code", "") == "AccessDenied":
                raise StoreWriteDenied(
                    writing,
                    f"S3 at {self.config.url} denied the write to access key {self.config.access_key!r} "
                    f"({describe(exc)})",
                    f"give that key write access (s3:PutObject, s3:DeleteObject) to s3://{self.bucket}/"
                    f"{self.prefix + '/' if self.prefix else ''}*, or use a store it may write; {CREDENTIALS_HINT}",
                ) from None
            if kind == ErrorKind.AUTH:
                refused = StoreAuthError(
                    f"S3 at {self.config.url} rejected the credentials (access key {self.config.access_key!r}) "
                    f"for {what}: {describe(exc)}. Fix: {CREDENTIALS_HINT}; "
                    "the key also needs read/write access to the bucket"
                )
                refused.code = auth_code(exc)
                raise refused from None
            if isinstance(exc, S3Error | ServerError | InvalidResponseError):
                raise StoreError(f"S3 {what} in {self.uri} failed at {self.config.url}: {describe(exc)}") from exc
            raise

    def _ensure_bucket(self) -> None:
        """Create the bucket before the first write if it does not exist (once per store object)."""
        if self._bucket_ready:
            return
        with self._bucket_lock:
            if self._bucket_ready:
                return
            if not self._call(f"bucket check of s3://{self.bucket}", lambda: self._client.bucket_exists(self.bucket)):

                def make() -> None:
                    try:
                        self._client.make_bucket(self.bucket, location=self.config.region or "us-east-1")
                    except S3Error as exc:
                        if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                            raise

                self._call(f"creation of bucket s3://{self.bucket}", make, writing=f"s3://{self.bucket}")
                log.info("created bucket %s at %s", self.bucket, self.config.url)
            self._bucket_ready = True

    # --- the interface ---
    def check(self) -> None:
        self._call(f"bucket check of s3://{self.bucket}", lambda: self._client.bucket_exists(self.bucket))

    def read_bytes(self, key: str) -> bytes:
        name = self._name(key)

        def get() -> bytes:
            response = self._client.get_object(self.bucket, name)
            try:
                return response.read()  # urllib3 enforces Content-Length: a cut stream raises, never truncates
            finally:
                response.close()
                response.release_conn()

        return self._call(f"read of {self._where(name)}", get, key=normalize_key(key))

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise StoreError(f"read_range({key!r}): offset and length must be >= 0, got {offset}, {length}")
        if length == 0:
            return b""
        name = self._name(key)

        def get() -> bytes:
            try:
                response = self._client.get_object(self.bucket, name, offset=offset, length=length)
            except S3Error as exc:
                if exc.code == "InvalidRange":  # at or past the end of the object
                    return b""
                raise
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return self._call(f"read of {self._where(name)}", get, key=normalize_key(key))

    def _put(self, what: str, fn: Callable[[], T], writing: str) -> T:
        """A write: make sure the bucket exists; if it vanished since (deleted by hand), recreate it once."""
        self._ensure_bucket()
        try:
            return self._call(what, fn, writing=writing)
        except StoreError as exc:
            if not isinstance(exc.__cause__, S3Error) or exc.__cause__.code != "NoSuchBucket":
                raise
            self._bucket_ready = False
            self._ensure_bucket()
            return self._call(what, fn, writing=writing)

    def write_bytes(self, key: str, data: bytes) -> None:
        name = self._name(key)
        data = bytes(data)
        self._put(
            f"write of {self._where(name)}",
            lambda: self._client.put_object(
                self.bucket,
                name,
                io.BytesIO(data),
                len(data),
                part_size=_SINGLE_PUT_MAX if len(data) <= _SINGLE_PUT_MAX else 0,
            ),
            self._where(name),
        )

    def upload_file(self, path: Path, key: str) -> None:
        name = self._name(key)
        if not Path(path).is_file():
            raise StoreError(f"upload_file: {path} is not a file")
        self._put(
            f"upload of {self._where(name)}",
            lambda: self._client.fput_object(self.bucket, name, str(path), part_size=_FILE_PART_SIZE),
            self._where(name),
        )

    def download_file(self, key: str, path: Path) -> Path:
        name = self._name(key)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # fget_object writes to a temporary part file and renames it: ``path`` is never half-written
        self._call(
            f"download of {self._where(name)}",
            lambda: self._client.fget_object(self.bucket, name, str(path)),
            key=normalize_key(key),
        )
        return path

    def exists(self, key: str) -> bool:
        name = self._name(key)

        def stat() -> bool:
            try:
                info = self._client.stat_object(self.bucket, name)
            except S3Error as exc:
                if exc.code in _NOT_FOUND_CODES:
                    return False
                raise
            return not info.is_dir

        return self._call(f"stat of {self._where(name)}", stat)

    def usage(self, prefix: str) -> int:
        folder = self._folder(prefix)

        def total() -> int:
            try:
                return sum(o.size or 0 for o in self._client.list_objects(self.bucket, prefix=folder, recursive=True))
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return 0
                raise

        return int(self._call(f"listing of {self._where(folder)}", total))

    def list(self, prefix: str, recursive: bool = True) -> list[str]:
        folder = self._folder(prefix)

        def names() -> list[str]:
            # Always list recursively and group here: some servers (SeaweedFS) keep empty folders
            # after their last object is deleted; deriving folders from objects hides them, as on disk.
            try:
                return [
                    o.object_name
                    for o in self._client.list_objects(self.bucket, prefix=folder, recursive=True)
                    if o.object_name and not o.object_name.endswith("/")
                ]
            except S3Error as exc:
                if exc.code == "NoSuchBucket":
                    return []
                raise

        found = self._call(f"listing of {self._where(folder)}", names)
        if recursive:
            return sorted(self._rel(n) for n in found)
        children = set()
        for n in found:
            head, sep, _ = n[len(folder) :].partition("/")
            children.add(self._rel(folder + head + sep))
        return sorted(children)

    def delete(self, key: str) -> None:
        name = self._name(key)

        def remove() -> None:
            try:
                self._client.remove_object(self.bucket, name)
            except S3Error as exc:
                if exc.code not in _NOT_FOUND_CODES:
                    raise

        self._call(f"delete of {self._where(name)}", remove, writing=self._where(name))

    def delete_prefix(self, prefix: str) -> None:
        """One batched DeleteObjects request per 1000 keys instead of one request per key."""
        keys = self.list(prefix)
        for i in range(0, len(keys), 1000):
            batch = [DeleteObject(self._name(k)) for k in keys[i : i + 1000]]

            def remove(batch: list[DeleteObject] = batch) -> None:
                errors = [e for e in self._client.remove_objects(self.bucket, batch) if e.code not in _NOT_FOUND_CODES]
                if errors:
                    first = errors[0]
                    raise StoreError(
                        f"S3 delete under {prefix!r} in {self.uri}: {len(errors)} object(s) not deleted, "
                        f"first {first.name}: {first.code} {first.message}"
                    )

            self._call(
                f"delete under {self._where(self._folder(prefix))}", remove, writing=self._where(self._folder(prefix))
            )

    # --- the run lock: a lease object written with conditions ---
    def _conditional_put(self, name: str, data: bytes, condition: dict[str, str]) -> str | None:
        """PUT with an ``If-None-Match`` / ``If-Match`` header: the new ETag, or None when the condition failed."""

        def put() -> str | None:
            try:
                # NOTE: the public put_object turns unknown headers into user metadata (x-amz-meta-if-match);
                # the SDK's own PutObject call sends them as they are.
                result = self._client._put_object(
                    self.bucket, name, data, headers={"Content-Type": "application/json", **condition}
                )
            except S3Error as exc:
                if exc.code in _PRECONDITION_CODES or (exc.code in _NOT_FOUND_CODES and "If-Match" in condition):
                    return None
                raise
            return result.etag

        return self._put(f"conditional write of {self._where(name)}", put, self._where(name))

    def _read_lease_raw(self, name: str) -> tuple[LeaseHolder | None, str] | None:
        """(holder, ETag) of the lease object; holder None when unreadable; None when there is none."""

        def get() -> tuple[bytes, str] | None:
            try:
                response = self._client.get_object(self.bucket, name)
            except S3Error as exc:
                if exc.code in _NOT_FOUND_CODES:
                    return None
                raise
            try:
                return response.read(), (response.headers.get("etag") or "").strip('"')
            finally:
                response.close()
                response.release_conn()

        got = self._call(f"read of {self._where(name)}", get)
        if got is None:
            return None
        try:
            return LeaseHolder.from_wire(json.loads(got[0])), got[1]
        except (ValueError, KeyError, TypeError):
            return None if not got[0].strip() else (None, got[1])

    def _lease_info(self, uri: str, holder: LeaseHolder | None, now: float) -> LeaseInfo:
        if holder is None:
            return LeaseInfo(uri, None, True, "the lock object is unreadable: delete it by hand if no runner runs")
        if holder.expired(now):
            return LeaseInfo(uri, holder, False, f"expired (not renewed since {holder.expires_at})")
        if holder.process_alive() is False:
            return LeaseInfo(uri, holder, False, f"process {holder.pid} is gone (same machine)")
        return LeaseInfo(uri, holder, True)

    def read_lease(self, key: str) -> LeaseInfo | None:
        got = self._read_lease_raw(self._name(key))
        return None if got is None else self._lease_info(self.uri_for(key), got[0], time.time())

    def acquire_lease(self, key: str, holder: LeaseHolder, ttl_s: float) -> Lease:
        """Take the lease object with If-None-Match; take over an expired (or provably dead) one with
        If-Match on the ETag read; read it back either way. A lost race is a refusal, never a wait."""
        name, uri = self._name(key), self.uri_for(key)
        for _ in range(5):  # bounded: each pass either wins, refuses, or saw the object change under it
            started = time.monotonic()
            mine = holder.renewed(time.time(), ttl_s)
            data = json.dumps(mine.to_wire(), sort_keys=True).encode("utf-8")
            etag = self._conditional_put(name, data, {"If-None-Match": "*"})
            if etag is None:
                current = self._read_lease_raw(name)
                if current is None:
                    continue  # released just now: try again
                other, other_etag = current
                if other is None or other.owner != holder.owner:  # (equal: our own retried PUT had landed)
                    info = self._lease_info(uri, other, time.time())
                    if info.live:
                        raise LeaseHeld(f"{uri} is held by {info.describe()}", info)
                    log.warning("taking over the lease %s from %s", uri, info.describe())
                    if self._conditional_put(name, data, {"If-Match": f'"{other_etag}"'}) is None:
                        continue  # renewed or taken by someone else meanwhile: look again
            back = self._read_lease_raw(name)
            if back is None or back[0] is None or back[0].owner != holder.owner:
                info = self.read_lease(key) or LeaseInfo(uri, None, False, "released again at once")
                raise LeaseHeld(f"{uri} was taken by {info.describe()} at the same moment", info)
            return _S3Lease(self, normalize_key(key), uri, name, back[0], back[1], ttl_s, started)
        info = self.read_lease(key) or LeaseInfo(uri, None, False)
        raise LeaseHeld(f"{uri} keeps changing hands ({info.describe()}); try again", info)

    def _conditional_delete(self, name: str, etag: str) -> None:
        """Delete the object only while its ETag is ``etag`` (else another holder has it: leave it)."""

        def remove() -> None:
            try:
                self._client._execute("DELETE", self.bucket, name, headers={"If-Match": f'"{etag}"'})
            except S3Error as exc:
                if exc.code in _PRECONDITION_CODES or exc.code in _NOT_FOUND_CODES:
                    return
                if exc.code != "NotImplemented":
                    raise
                current = self._read_lease_raw(name)  # a server without conditional deletes: best effort
                if current is not None and current[1] == etag:
                    self._client.remove_object(self.bucket, name)

        self._call(f"release of {self._where(name)}", remove, writing=self._where(name))


class _S3Lease(Lease):
    """A held lease object. Renewed with If-Match; lost when that fails, or when renewals kept failing
    for long enough that another runner may already have taken it over."""

    def __init__(
        self,
        store: S3Store,
        key: str,
        uri: str,
        name: str,
        holder: LeaseHolder,
        etag: str,
        ttl_s: float,
        renewed_at: float,
    ):
        self.store, self.key, self.uri, self.name, self.holder, self.etag = store, key, uri, name, holder, etag
        self.ttl_s = ttl_s
        self.renew_interval_s = ttl_s / 3
        self._valid_until = renewed_at + ttl_s
        self._lock = threading.Lock()
        self.lost: str | None = None
        self.released = False

    def check(self) -> None:
        if self.lost:
            raise LeaseLost(self.lost)
        # give up a sixth of the ttl early: another machine's clock may run a little ahead of ours
        if time.monotonic() > self._valid_until - self.ttl_s / 6:
            self.lost = (
                f"{self.uri}: could not renew the lease for {self.ttl_s:.0f} s (store unreachable?); another "
                "runner may take the run over, so this one stops"
            )
            raise LeaseLost(self.lost)

    def renew(self) -> None:
        with self._lock:
            if self.released:
                return
            self.check()
            started = time.monotonic()
            mine = self.holder.renewed(time.time(), self.ttl_s)
            data = json.dumps(mine.to_wire(), sort_keys=True).encode("utf-8")
            etag = self.store._conditional_put(self.name, data, {"If-Match": f'"{self.etag}"'})
            if etag is None:
                current = self.store._read_lease_raw(self.name)
                if current is None or current[0] is None or current[0].owner != self.holder.owner:
                    who = current[0].describe() if current and current[0] else "nobody (deleted)"
                    self.lost = f"{self.uri} was taken over by {who} after this runner's lease expired"
                    raise LeaseLost(self.lost)
                etag = current[1]  # our own retried PUT had landed
            self.holder, self.etag, self._valid_until = mine, etag, started + self.ttl_s

    def release(self) -> None:
        with self._lock:
            if self.released:
                return
            self.released = True
            if self.lost is None:
                self.store._conditional_delete(self.name, self.etag)
