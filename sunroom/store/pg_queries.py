"""The SQL behind :class:`~sunroom.store.postgres.PostgresStore`: sessions, ownership, the log.

Every function takes a pooled connection in autocommit mode and, for writes, runs one
transaction (``READ COMMITTED``) that first locks the session's row with
``SELECT ... FOR UPDATE``: writers of one session (in any process) queue on that lock, so each
read-check-write (owner, generation, last seq) is atomic. The checks after the lock are new
statements, so they see everything the previous holder committed. The clock is read once the
lock is held, in Python (the store's clock, injectable), never ``now()`` in SQL. Reads are
single statements, each a consistent snapshot. An append, the hot path, is one statement: the
function ``sunroom_append`` (migration 2) takes the same lock and makes the same checks
server-side, in one round trip (see :func:`append`).

Text ids sort with ``COLLATE "C"`` (by code point, as SQLite sorts), whatever the database's
collation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from sunroom.errors import StoreConflictError, StoreNotFoundError
from sunroom.store.queries import (
    Clock,
    EventRow,
    decode,
    session_from_row,
)
from sunroom.store.records import SessionRecord, SessionStatus, StoredEvent

__all__ = [
    "CHANNEL",
    "Conn",
    "append",
    "claim",
    "create_session",
    "events",
    "finish_session",
    "get_session",
    "holds",
    "last_seq",
    "list_sessions",
    "lock_session",
    "orphaned_sessions",
    "purge",
    "release",
    "renew",
    "reopen_session",
    "require_owner",
]

Conn = AsyncConnection[TupleRow]

CHANNEL: Final = "sunroom_events"
"""The NOTIFY channel: each append notifies it with its session id, in its transaction.

The function ``sunroom_append`` (migration 2) spells it too; a change is a new migration."""

_SESSION: Final = (
    "SELECT id, status, config::text, result::text, created_at, updated_at, finished_at,"
    " owner, lease_expires_at, generation FROM sessions"
)
_LOCK: Final = "SELECT owner, lease_expires_at, generation FROM sessions WHERE id = %s FOR UPDATE"
_PURGE_BATCH: Final = 20


async def lock_session(conn: Conn, session_id: str) -> tuple[str | None, float | None, int]:
    """Lock the session's row for this transaction; its owner, lease and generation.

    Raises StoreNotFoundError when there is no such session.
    """
    cursor = await conn.execute(_LOCK, (session_id,))
    return _locked(session_id, await cursor.fetchone())


def _locked(session_id: str, row: Sequence[Any] | None) -> tuple[str | None, float | None, int]:
    if row is None:
        raise StoreNotFoundError(f"no session {session_id!r}")
    return row[0], row[1], row[2]


def _check_owner(
    session_id: str,
    locked: tuple[str | None, float | None, int],
    owner: str,
    generation: int | None,
) -> None:
    holder, _, current = locked
    if holder != owner or (generation is not None and generation != current):
        at = "" if generation is None else f" at generation {generation} (now {current})"
        raise StoreConflictError(
            f"session {session_id!r} is not owned by {owner!r}{at} (owner: {holder!r})",
            reason="not_owner",
            session_id=session_id,
        )


async def holds(conn: Conn, session_id: str, owner: str, generation: int | None) -> bool:
    """Lock the session; whether *owner* holds it (at *generation* when given)."""
    holder, _, current = await lock_session(conn, session_id)
    return holder == owner and (generation is None or generation == current)


async def require_owner(
    conn: Conn, session_id: str, owner: str, generation: int | None = None
) -> None:
    """Lock the session; StoreNotFoundError, or StoreConflictError unless *owner* holds it."""
    _check_owner(session_id, await lock_session(conn, session_id), owner, generation)


async def _must_get(conn: Conn, session_id: str) -> SessionRecord:
    record = await get_session(conn, session_id)
    if record is None:  # pragma: no cover - only after a check in the same transaction
        raise StoreNotFoundError(f"no session {session_id!r}")
    return record


# --- sessions ---------------------------------------------------------------------------------


async def create_session(
    conn: Conn,
    clock: Clock,
    session_id: str,
    config: str,
    created_at: float | None,
    owner: str | None,
    lease_s: float | None,
) -> SessionRecord:
    """Insert a running session (claimed by *owner* when given); conflict if the id exists."""
    async with conn.transaction():
        now = clock()
        expires = None if owner is None or lease_s is None else now + lease_s
        cursor = await conn.execute(
            "INSERT INTO sessions (id, status, config, created_at, updated_at, owner,"
            " lease_expires_at, generation) VALUES (%s, 'running', %s::json, %s, %s, %s, %s, %s)"
            " ON CONFLICT (id) DO NOTHING",
            (
                session_id,
                config,
                now if created_at is None else created_at,
                now,
                owner,
                expires,
                0 if owner is None else 1,
            ),
        )
        if cursor.rowcount == 0:
            raise StoreConflictError(
                f"session {session_id!r} already exists", reason="exists", session_id=session_id
            )
        return await _must_get(conn, session_id)


async def get_session(conn: Conn, session_id: str) -> SessionRecord | None:
    """The session's record, or None."""
    cursor = await conn.execute(f"{_SESSION} WHERE id = %s", (session_id,))
    row = await cursor.fetchone()
    return None if row is None else session_from_row(row)


async def list_sessions(
    conn: Conn, status: SessionStatus | None, limit: int
) -> list[SessionRecord]:
    """Up to *limit* sessions, newest first, of *status* when given."""
    order = ' ORDER BY created_at DESC, id COLLATE "C" LIMIT %s'
    if status is None:
        cursor = await conn.execute(f"{_SESSION}{order}", (limit,))
    else:
        cursor = await conn.execute(f"{_SESSION} WHERE status = %s{order}", (status, limit))
    return [session_from_row(row) for row in await cursor.fetchall()]


async def finish_session(
    conn: Conn,
    clock: Clock,
    session_id: str,
    status: SessionStatus,
    result: str | None,
    owner: str | None,
    generation: int | None = None,
) -> SessionRecord:
    """End the running session's run with *status* and *result*; the owner checked if given."""
    async with conn.transaction():
        if owner is None:
            await lock_session(conn, session_id)
        else:
            await require_owner(conn, session_id, owner, generation)
        now = clock()
        cursor = await conn.execute(
            "UPDATE sessions SET status = %s, result = %s::json, finished_at = %s,"
            " updated_at = %s WHERE id = %s AND status = 'running'",
            (status, result, now, now, session_id),
        )
        if cursor.rowcount == 0:
            current = (await _must_get(conn, session_id)).status
            raise StoreConflictError(
                f"session {session_id!r} already ended its run ({current}); reopen it first",
                reason="finished",
                session_id=session_id,
            )
        return await _must_get(conn, session_id)


async def reopen_session(
    conn: Conn, clock: Clock, session_id: str, owner: str, generation: int | None = None
) -> SessionRecord:
    """Set the owned session running again, clearing its result."""
    async with conn.transaction():
        await require_owner(conn, session_id, owner, generation)
        await conn.execute(
            "UPDATE sessions SET status = 'running', result = NULL, finished_at = NULL,"
            " updated_at = %s WHERE id = %s",
            (clock(), session_id),
        )
        return await _must_get(conn, session_id)


async def orphaned_sessions(conn: Conn, clock: Clock, limit: int) -> list[SessionRecord]:
    """Running sessions without a live lease, oldest first."""
    cursor = await conn.execute(
        f"{_SESSION} WHERE status = 'running' AND (owner IS NULL OR lease_expires_at <= %s)"
        ' ORDER BY created_at, id COLLATE "C" LIMIT %s',
        (clock(), limit),
    )
    return [session_from_row(row) for row in await cursor.fetchall()]


# --- ownership --------------------------------------------------------------------------------


async def claim(conn: Conn, clock: Clock, session_id: str, owner: str, lease_s: float) -> bool:
    """Take the session if unowned, expired or already *owner*'s (a new generation unless so)."""
    async with conn.transaction():
        holder, expires, generation = await lock_session(conn, session_id)
        now = clock()
        if holder is not None and holder != owner and expires is not None and expires > now:
            return False
        await conn.execute(
            "UPDATE sessions SET owner = %s, lease_expires_at = %s, updated_at = %s,"
            " generation = %s WHERE id = %s",
            (owner, now + lease_s, now, generation + (holder != owner), session_id),
        )
        return True


async def renew(
    conn: Conn,
    clock: Clock,
    session_id: str,
    owner: str,
    lease_s: float,
    generation: int | None = None,
) -> bool:
    """Extend *owner*'s lease; False when it does not hold the session (at *generation*)."""
    async with conn.transaction():
        if not await holds(conn, session_id, owner, generation):
            return False
        now = clock()
        await conn.execute(
            "UPDATE sessions SET lease_expires_at = %s, updated_at = %s WHERE id = %s",
            (now + lease_s, now, session_id),
        )
        return True


async def release(
    conn: Conn, clock: Clock, session_id: str, owner: str, generation: int | None = None
) -> bool:
    """Clear *owner*'s hold; False when it did not hold the session (at *generation*)."""
    async with conn.transaction():
        if not await holds(conn, session_id, owner, generation):
            return False
        await conn.execute(
            "UPDATE sessions SET owner = NULL, lease_expires_at = NULL, updated_at = %s"
            " WHERE id = %s",
            (clock(), session_id),
        )
        return True


# --- the event log ----------------------------------------------------------------------------


async def append(
    conn: Conn,
    session_id: str,
    rows: Sequence[EventRow],
    owner: str,
    generation: int | None = None,
) -> int:
    """Insert *rows* if *owner* holds the session and their seqs continue the log.

    One statement, one round trip: the function ``sunroom_append`` (migration 2) locks the
    session's row, checks the owner, the generation and the seqs, inserts the batch and
    notifies :data:`CHANNEL` with the session id (delivered when, and only if, it commits), in
    the statement's own transaction. A refusal comes back as its verdict; nothing is written.
    """
    cursor = await conn.execute(
        "SELECT verdict, last_seq, holder, current_generation FROM sunroom_append("
        "%s, %s, %s, %s::bigint[], %s::text[], %s::text[], %s::float8[])",
        (
            session_id,
            owner,
            generation,
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
        ),
    )
    row = await cursor.fetchone()
    verdict, last, holder, current = row if row is not None else ("not_found", 0, None, 0)
    if verdict == "ok":
        return int(last)
    if verdict == "not_found":
        raise StoreNotFoundError(f"no session {session_id!r}")
    if verdict == "not_owner":
        _check_owner(session_id, (holder, None, current), owner, generation)
    seqs = [r[0] for r in rows]
    raise StoreConflictError(
        f"session {session_id!r}: events must continue from seq {last + 1},"
        f" got seqs {seqs[:5]}{' ...' if len(seqs) > 5 else ''}",
        reason="seq",
        session_id=session_id,
        last_seq=int(last),
    )


async def events(
    conn: Conn, session_id: str, after_seq: int, limit: int | None
) -> list[StoredEvent]:
    """Events after *after_seq*, in order, at most *limit* (None: all)."""
    cursor = await conn.execute(
        "SELECT seq, kind, payload::text, ts FROM events WHERE session_id = %s AND seq > %s"
        " ORDER BY seq LIMIT %s",
        (session_id, after_seq, limit),
    )
    return [
        StoredEvent(session_id=session_id, seq=seq, kind=kind, payload=decode(payload), ts=ts)
        for seq, kind, payload, ts in await cursor.fetchall()
    ]


async def last_seq(conn: Conn, session_id: str) -> int:
    """The last seq (0 when none); StoreNotFoundError for no session."""
    cursor = await conn.execute(
        "SELECT (SELECT max(seq) FROM events WHERE session_id = s.id) FROM sessions AS s"
        " WHERE s.id = %s",
        (session_id,),
    )
    row = await cursor.fetchone()
    if row is None:
        raise StoreNotFoundError(f"no session {session_id!r}")
    return int(row[0] or 0)


# --- retention --------------------------------------------------------------------------------


async def purge(conn: Conn, older_than_s: float, now: float) -> int:
    """Delete unleased, non-running sessions finished before now - *older_than_s*.

    In transactions of at most 20 sessions each; rows another transaction holds locked (a
    claim under way) are skipped this time.
    """
    total = 0
    while True:
        async with conn.transaction():
            cursor = await conn.execute(
                "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions"
                " WHERE status != 'running' AND finished_at < %s"
                " AND (owner IS NULL OR lease_expires_at <= %s)"
                " LIMIT %s FOR UPDATE SKIP LOCKED)",
                (now - older_than_s, now, _PURGE_BATCH),
            )
            deleted = cursor.rowcount
        if deleted <= 0:
            return total
        total += deleted
