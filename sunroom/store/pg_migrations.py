"""The versioned PostgreSQL schema: :data:`PG_MIGRATIONS`, applied in order by :func:`migrate`.

The same tables and columns as SQLite's (:mod:`sunroom.store.migrations`), in PostgreSQL's
types: ``DOUBLE PRECISION`` times, ``BIGINT`` counts, ``BOOLEAN`` flags and ``json`` documents.
``json``, not ``jsonb``: it keeps the exact text sunroom wrote (``jsonb`` refuses NUL escapes
and lone surrogates, which SQLite keeps), so a payload reads back equal to what was appended.
``calls`` has one more column, ``position`` (an identity), for the start order SQLite takes
from its rowid; migration 2 also creates the function ``sunroom_append`` (an append in one
round trip, see :func:`sunroom.store.pg_queries.append`).

Opening a store applies, in one transaction, every migration newer than the highest version
in its ``schema_version`` table, and records each one. The transaction first takes a
transaction-level advisory lock (``pg_advisory_xact_lock``), so replicas starting at once are
serialised: the second finds the work done. A database whose recorded version is newer than
the newest migration here was written by a newer sunroom and is refused
(:class:`~sunroom.errors.StoreVersionError`), never modified. Everything lives in one schema
(``public`` unless the store names another, which is created when missing).

Rules for adding a migration: append, never edit a released one; keep SQLite's
(:data:`~sunroom.store.migrations.MIGRATIONS`) at the same version with the same meaning.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

from psycopg import AsyncConnection, sql
from psycopg.rows import TupleRow

from sunroom.errors import StoreVersionError

__all__ = ["LOCK_KEY", "PG_MIGRATIONS", "migrate"]

_V1: Final = """
CREATE TABLE sessions (
    id               TEXT PRIMARY KEY NOT NULL,
    status           TEXT NOT NULL CHECK (status IN
                         ('running', 'finished', 'failed', 'cancelled', 'interrupted')),
    config           JSON NOT NULL,
    result           JSON,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    finished_at      DOUBLE PRECISION,           -- NULL while running
    owner            TEXT,                       -- NULL: nobody may write
    lease_expires_at DOUBLE PRECISION,           -- NULL when owner is NULL
    CHECK ((owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE INDEX sessions_by_status ON sessions (status, created_at);
CREATE INDEX sessions_by_finish ON sessions (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL CHECK (seq >= 1),
    kind       TEXT NOT NULL,
    payload    JSON NOT NULL,
    ts         DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE calls (
    position    BIGINT GENERATED ALWAYS AS IDENTITY,  -- the start order
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    call_id     TEXT NOT NULL,
    name        TEXT NOT NULL,
    args        JSON NOT NULL,
    side_effect BOOLEAN NOT NULL,
    started_at  DOUBLE PRECISION NOT NULL,
    started_by  TEXT NOT NULL,
    outcome     TEXT CHECK (outcome IN ('ok', 'error', 'unknown')),
    result      JSON,                                 -- NULL while unfinished
    finished_at DOUBLE PRECISION,
    UNIQUE (session_id, call_id),
    CHECK ((outcome IS NULL) = (finished_at IS NULL))
);
CREATE INDEX calls_unfinished ON calls (session_id) WHERE outcome IS NULL;
"""

_V2: Final = """
ALTER TABLE sessions ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
UPDATE sessions SET generation = 1 WHERE owner IS NOT NULL;

CREATE TABLE replicas (
    id           TEXT PRIMARY KEY NOT NULL,      -- the replica's owner string
    url          TEXT NOT NULL,                  -- its internal base URL
    load         BIGINT NOT NULL CHECK (load >= 0),
    capacity     BIGINT NOT NULL CHECK (capacity >= 0),
    draining     BOOLEAN NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL,
    expires_at   DOUBLE PRECISION NOT NULL
);

CREATE TABLE kernels (
    id         TEXT PRIMARY KEY NOT NULL,
    replica    TEXT NOT NULL,                    -- the replica that holds it
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX kernels_by_replica ON kernels (replica, created_at);

-- An append in one round trip (sunroom.store.pg_queries.append): lock the session's row, check
-- the owner (and generation, unless NULL), check the seqs continue the log, insert, notify.
-- Each statement of a volatile function takes a fresh snapshot, so the last seq read after the
-- lock sees what the previous holder of the lock committed. Refusals are a verdict, not an
-- error: nothing is written and the row lock ends with the statement.
CREATE FUNCTION sunroom_append(
    p_session TEXT, p_owner TEXT, p_generation BIGINT,
    p_seqs BIGINT[], p_kinds TEXT[], p_payloads TEXT[], p_ts DOUBLE PRECISION[],
    OUT verdict TEXT, OUT last_seq BIGINT, OUT holder TEXT, OUT current_generation BIGINT
) LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    SELECT owner, generation INTO holder, current_generation
        FROM sessions WHERE id = p_session FOR UPDATE;
    IF NOT FOUND THEN
        verdict := 'not_found';
        RETURN;
    END IF;
    IF holder IS DISTINCT FROM p_owner OR p_generation <> current_generation THEN
        verdict := 'not_owner';
        RETURN;
    END IF;
    SELECT coalesce(max(seq), 0) INTO last_seq FROM events WHERE session_id = p_session;
    IF EXISTS (SELECT 1 FROM unnest(p_seqs) WITH ORDINALITY AS given (seq, i)
               WHERE given.seq <> last_seq + given.i) THEN
        verdict := 'seq';
        RETURN;
    END IF;
    IF coalesce(cardinality(p_seqs), 0) > 0 THEN
        INSERT INTO events (session_id, seq, kind, payload, ts)
            SELECT p_session, b.seq, b.kind, b.payload::json, b.ts
            FROM unnest(p_seqs, p_kinds, p_payloads, p_ts) AS b (seq, kind, payload, ts);
        PERFORM pg_notify('sunroom_events', p_session);
        last_seq := last_seq + cardinality(p_seqs);
    END IF;
    verdict := 'ok';
END
$fn$;
"""

PG_MIGRATIONS: Final[tuple[tuple[int, str], ...]] = ((1, _V1), (2, _V2))
"""Every schema change, oldest first (the versions of SQLite's, in PostgreSQL's SQL)."""

LOCK_KEY: Final = 0x5375_6E72_6F6F_6D31  # "Sunroom1": the advisory lock of migrations
"""The ``pg_advisory_xact_lock`` key migrations hold (advisory locks are per database)."""

_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS schema_version ("
    " version INTEGER PRIMARY KEY NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)


async def migrate(
    conn: AsyncConnection[TupleRow],
    migrations: Sequence[tuple[int, str]] = PG_MIGRATIONS,
    *,
    schema: str = "public",
    now: float | None = None,
) -> int:
    """Bring *conn*'s database (its *schema*) up to the newest of *migrations*; that version.

    *conn* must be in autocommit mode, outside a transaction; its ``search_path`` is set to
    *schema* (created when missing) and stays so. All pending migrations run in one
    transaction under the advisory lock: on any error nothing is applied and the error
    propagates. Raises StoreVersionError when the database is newer than *migrations*;
    ValueError when *migrations* are not numbered 1, 2, 3 ...
    """
    versions = [version for version, _ in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3 ... in order, got {versions}")
    newest = versions[-1] if versions else 0
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        found = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        if await found.fetchone() is None:  # (CREATE SCHEMA IF NOT EXISTS needs the right)
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        await conn.execute(_VERSION_TABLE)
        cursor = await conn.execute("SELECT max(version) FROM schema_version")
        row = await cursor.fetchone()
        current = int(row[0] or 0) if row is not None else 0
        if current > newest:
            raise StoreVersionError(
                f"the database's schema version is {current}, newer than this sunroom's "
                f"({newest}): it was written by a newer sunroom; upgrade sunroom to open it"
            )
        applied_at = time.time() if now is None else now
        for version, script in migrations[current:]:
            if script.strip():
                await conn.execute(script.encode())
            await conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)",
                (version, applied_at),
            )
    return max(current, newest)
