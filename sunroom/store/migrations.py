"""The versioned SQLite schema: :data:`MIGRATIONS`, applied in order by :func:`migrate`.

Each migration is ``(version, sql)``; versions run 1, 2, 3 ... without gaps. Opening a database
applies, inside one ``BEGIN IMMEDIATE`` transaction, every migration newer than the highest
version recorded in its ``schema_version`` table, and records each one. Two processes opening a
fresh file at once are serialised by that transaction: the second finds the work done. A
database whose recorded version is newer than the newest migration here was written by a newer
sunroom and is refused (:class:`~sunroom.errors.StoreVersionError`), never modified.

Rules for adding a migration: append, never edit a released one; keep it to statements SQLite
can run inside a transaction (no ``VACUUM``, no ``PRAGMA journal_mode``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Final

from sunroom.errors import StoreVersionError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate", "split_statements"]

_V1: Final = """
CREATE TABLE sessions (
    id               TEXT PRIMARY KEY NOT NULL,
    status           TEXT NOT NULL CHECK (status IN
                         ('running', 'finished', 'failed', 'cancelled', 'interrupted')),
    config           TEXT NOT NULL,           -- JSON object
    result           TEXT,                    -- JSON object, or NULL
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL,                    -- NULL while running
    owner            TEXT,                    -- NULL: nobody may write
    lease_expires_at REAL,                    -- NULL when owner is NULL
    CHECK ((owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE INDEX sessions_by_status ON sessions (status, created_at);
CREATE INDEX sessions_by_finish ON sessions (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL CHECK (seq >= 1),
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,                 -- JSON object
    ts         REAL NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE TABLE calls (
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    call_id     TEXT NOT NULL,
    name        TEXT NOT NULL,
    args        TEXT NOT NULL,                -- JSON object
    side_effect INTEGER NOT NULL CHECK (side_effect IN (0, 1)),
    started_at  REAL NOT NULL,
    started_by  TEXT NOT NULL,
    outcome     TEXT CHECK (outcome IN ('ok', 'error', 'unknown')),
    result      TEXT,                         -- JSON object, NULL while unfinished
    finished_at REAL,
    UNIQUE (session_id, call_id),
    CHECK ((outcome IS NULL) = (finished_at IS NULL))
);
CREATE INDEX calls_unfinished ON calls (session_id) WHERE outcome IS NULL;
"""

_V2: Final = """
ALTER TABLE sessions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET generation = 1 WHERE owner IS NOT NULL;

CREATE TABLE replicas (
    id           TEXT PRIMARY KEY NOT NULL,   -- the replica's owner string
    url          TEXT NOT NULL,               -- its internal base URL
    load         INTEGER NOT NULL CHECK (load >= 0),
    capacity     INTEGER NOT NULL CHECK (capacity >= 0),
    draining     INTEGER NOT NULL CHECK (draining IN (0, 1)),
    heartbeat_at REAL NOT NULL,
    expires_at   REAL NOT NULL
);

CREATE TABLE kernels (
    id         TEXT PRIMARY KEY NOT NULL,
    replica    TEXT NOT NULL,                 -- the replica that holds it
    created_at REAL NOT NULL
);
CREATE INDEX kernels_by_replica ON kernels (replica, created_at);
"""

MIGRATIONS: Final[tuple[tuple[int, str], ...]] = ((1, _V1), (2, _V2))
"""Every schema change, oldest first."""

SCHEMA_VERSION: Final[int] = MIGRATIONS[-1][0]
"""The schema version this sunroom writes."""

_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    " version INTEGER PRIMARY KEY NOT NULL, applied_at REAL NOT NULL)"
)


def split_statements(sql: str) -> Iterator[str]:
    """The complete SQL statements in *sql*, one at a time (semicolons in literals are kept)."""
    pending = ""
    for piece in sql.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            pending = ""
            if statement != ";":
                yield statement
    if pending.strip(" \n\t;"):
        raise ValueError(f"incomplete SQL statement: {pending.strip()[:80]!r}")


def migrate(
    conn: sqlite3.Connection,
    migrations: Sequence[tuple[int, str]] = MIGRATIONS,
    *,
    now: float | None = None,
) -> int:
    """Bring *conn*'s database up to the newest of *migrations*; its version afterwards.

    *conn* must be in autocommit mode (``isolation_level=None``) and outside a transaction.
    All pending migrations run in one ``BEGIN IMMEDIATE`` transaction: on any error nothing is
    applied and the error propagates. Raises StoreVersionError when the database is newer
    than *migrations*; ValueError when *migrations* are not numbered 1, 2, 3 ...
    """
    versions = [version for version, _ in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3 ... in order, got {versions}")
    newest = versions[-1] if versions else 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_VERSION_TABLE)
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        current = int(row[0] or 0)
        if current > newest:
            raise StoreVersionError(
                f"the database's schema version is {current}, newer than this sunroom's "
                f"({newest}): it was written by a newer sunroom; upgrade sunroom to open it"
            )
        applied_at = time.time() if now is None else now
        for version, sql in migrations[current:]:
            for statement in split_statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, applied_at),
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return max(current, newest)
