"""Durable sessions: an append-only event log, run records and call records.

:class:`~sunroom.store.seam.EventStore` is the seam every backend provides;
:class:`~sunroom.store.sqlite.SQLiteStore` is the embedded default (one SQLite file, no setup).
The guide is ``docs/store.md``.
"""

from __future__ import annotations

from sunroom.errors import (
    StoreConflictError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
)
from sunroom.store.migrations import MIGRATIONS, SCHEMA_VERSION
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
]
