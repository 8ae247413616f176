"""Durable sessions: an append-only event log, run records and call records.

:class:`~sunroom.store.seam.EventStore` is the seam every backend provides;
:class:`~sunroom.store.sqlite.SQLiteStore` is the embedded default (one SQLite file, no setup);
:class:`~sunroom.store.postgres.PostgresStore` the shared one (the ``postgres`` extra), exported
lazily so that importing this package never imports psycopg. :func:`open_store` picks one from
a path or URL. The guide is ``docs/store.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sunroom.errors import (
    StoreConflictError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
)
from sunroom.store.migrations import MIGRATIONS, SCHEMA_VERSION
from sunroom.store.open import open_store
from sunroom.store.records import (
    CallOutcome,
    CallRecord,
    JSONObject,
    KernelPlacement,
    NewEvent,
    ReplicaRecord,
    SessionRecord,
    SessionStatus,
    StoredEvent,
    idempotency_key,
)
from sunroom.store.seam import AppendFollower, EventStore
from sunroom.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from sunroom.store.postgres import PostgresStore

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AppendFollower",
    "CallOutcome",
    "CallRecord",
    "EventStore",
    "JSONObject",
    "KernelPlacement",
    "NewEvent",
    "PostgresStore",
    "ReplicaRecord",
    "SQLiteStore",
    "SessionRecord",
    "SessionStatus",
    "StoreConflictError",
    "StoreError",
    "StoreNotFoundError",
    "StoreVersionError",
    "StoredEvent",
    "idempotency_key",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """``PostgresStore``, imported on first use (it needs the ``postgres`` extra)."""
    if name == "PostgresStore":
        from sunroom.extras import require

        require("postgres", "the PostgreSQL store")
        from sunroom.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
