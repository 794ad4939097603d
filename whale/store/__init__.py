"""One storage client owns all object-store I/O (see ``whale.store.base.Store``).

``open_store("file:///dir")`` or ``open_store("/dir")`` gives the local-directory backend (the
embedded default); ``open_store("s3://bucket/prefix", endpoint=...)`` the S3 backend (MinIO SDK).
"""

from whale.store.base import (
    ObjectNotFound,
    Store,
    StoreAuthError,
    StoreError,
    StoreFull,
    StoreReadOnly,
    StoreUnavailable,
    StoreWriteDenied,
    StoreWriteError,
    open_store,
)

__all__ = [
    "ObjectNotFound",
    "Store",
    "StoreAuthError",
    "StoreError",
    "StoreFull",
    "StoreReadOnly",
    "StoreUnavailable",
    "StoreWriteDenied",
    "StoreWriteError",
    "open_store",
]
