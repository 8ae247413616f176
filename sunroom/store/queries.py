"""The SQL behind :class:`~sunroom.store.sqlite.SQLiteStore`: blocking, one transaction each.

Every function takes the store's connection (autocommit mode, on the store's thread) and its
clock. Writes run in ``BEGIN IMMEDIATE`` transactions, which take SQLite's write lock *before*
reading, so a read-check-write is atomic across processes; the clock is read after the lock is
held. Reads are single statements, each a consistent snapshot under WAL.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, cast

from sunroom.errors import StoreConflictError, StoreNotFoundError, UsageError
from sunroom.store.records import (
    JSONObject,
    SessionRecord,
    SessionStatus,
    StoredEvent,
)

__all__ = [
    "session_from_row",
    "Clock",
    "EventRow",
    "decode",
    "require_owner",
    "transaction",
    "append",
    "claim",
    "create_session",
    "encode",
    "events",
    "finish_session",
    "get_session",
    "last_seq",
    "list_sessions",
    "orphaned_sessions",
    "purge",
    "release",
    "renew",
    "reopen_session",
]

Clock = Callable[[], float]
EventRow = tuple[int, str, str, float]
"""An event ready to insert: seq, kind, payload (JSON text), ts."""

_SESSION: Final = (
    "SELECT id, status, config, result, created_at, updated_at, finished_at, owner,"
    " lease_expires_at, generation FROM sessions"
)
_PURGE_BATCH: Final = 20


def encode(value: object, what: str) -> str:
    """*value* as JSON text; UsageError unless it is a JSON object (no NaN, no infinity)."""
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} is not JSON-serialisable: {exc}") from exc


def decode(text: str) -> JSONObject:
    """Parse JSON text that the store wrote."""
    return cast(JSONObject, json.loads(text))


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def session_from_row(row: Sequence[Any]) -> SessionRecord:
    """A run record from a row of ``_SESSION``'s columns (JSON as text; both backends)."""
    return SessionRecord(
        session_id=row[0],
        status=row[1],
        config=decode(row[2]),
        result=None if row[3] is None else decode(row[3]),
        created_at=row[4],
        updated_at=row[5],
        finished_at=row[6],
        owner=row[7],
        lease_expires_at=row[8],
        generation=row[9],
    )


def _owner_of(conn: sqlite3.Connection, session_id: str) -> tuple[str | None, float | None, int]:
    row = conn.execute(
        "SELECT owner, lease_expires_at, generation FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    if row is None:
        raise StoreNotFoundError(f"no session {session_id!r}")
    return row[0], row[1], row[2]


def holds(conn: sqlite3.Connection, session_id: str, owner: str, generation: int | None) -> bool:
    """Whether *owner* holds the session (at *generation* when given); StoreNotFoundError."""
    holder, _, current = _owner_of(conn, session_id)
    return holder == owner and (generation is None or generation == current)


def require_owner(
    conn: sqlite3.Connection, session_id: str, owner: str, generation: int | None = None
) -> None:
    """StoreNotFoundError for no session; StoreConflictError unless *owner* holds it.

    With *generation*, the session's fencing generation must be that one too.
    """
    if not holds(conn, session_id, owner, generation):
        holder, _, current = _owner_of(conn, session_id)
        at = "" if generation is None else f" at generation {generation} (now {current})"
        raise StoreConflictError(
            f"session {session_id!r} is not owned by {owner!r}{at} (owner: {holder!r})",
            reason="not_owner",
            session_id=session_id,
        )


def _must_get(conn: sqlite3.Connection, session_id: str) -> SessionRecord:
    record = get_session(conn, session_id)
    if record is None:  # pragma: no cover - only after a check in the same transaction
        raise StoreNotFoundError(f"no session {session_id!r}")
    return record


# --- sessions ---------------------------------------------------------------------------------


def create_session(
    conn: sqlite3.Connection,
    clock: Clock,
    session_id: str,
    config: str,
    created_at: float | None,
    owner: str | None,
    lease_s: float | None,
) -> SessionRecord:
    """Insert a running session (claimed by *owner* when given); conflict if the id exists."""
    with transaction(conn):
        now = clock()
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
            raise StoreConflictError(
                f"session {session_id!r} already exists", reason="exists", session_id=session_id
            )
        expires = None if owner is None or lease_s is None else now + lease_s
        conn.execute(
            "INSERT INTO sessions (id, status, config, created_at, updated_at, owner,"
            " lease_expires_at, generation) VALUES (?, 'running', ?, ?, ?, ?, ?, ?)",
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
        return _must_get(conn, session_id)


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    """The session's record, or None."""
    row = conn.execute(f"{_SESSION} WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else session_from_row(row)


def list_sessions(
    conn: sqlite3.Connection, status: SessionStatus | None, limit: int
) -> list[SessionRecord]:
    """Up to *limit* sessions, newest first, of *status* when given."""
    if status is None:
        rows = conn.execute(f"{_SESSION} ORDER BY created_at DESC, id LIMIT ?", (limit,)).fetchall()
    else:
        rows = conn.execute(
            f"{_SESSION} WHERE status = ? ORDER BY created_at DESC, id LIMIT ?", (status, limit)
        ).fetchall()
    return [session_from_row(row) for row in rows]


def finish_session(
    conn: sqlite3.Connection,
    clock: Clock,
    session_id: str,
    status: SessionStatus,
    result: str | None,
    owner: str | None,
    generation: int | None = None,
) -> SessionRecord:
    """End the running session's run with *status* and *result*; the owner checked if given."""
    with transaction(conn):
        now = clock()
        if owner is None:
            _owner_of(conn, session_id)
        else:
            require_owner(conn, session_id, owner, generation)
        cursor = conn.execute(
            "UPDATE sessions SET status = ?, result = ?, finished_at = ?, updated_at = ?"
            " WHERE id = ? AND status = 'running'",
            (status, result, now, now, session_id),
        )
        if cursor.rowcount == 0:
            current = _must_get(conn, session_id).status
            raise StoreConflictError(
                f"session {session_id!r} already ended its run ({current}); reopen it first",
                reason="finished",
                session_id=session_id,
            )
        return _must_get(conn, session_id)


def reopen_session(
    conn: sqlite3.Connection,
    clock: Clock,
    session_id: str,
    owner: str,
    generation: int | None = None,
) -> SessionRecord:
    """Set the owned session running again, clearing its result."""
    with transaction(conn):
        now = clock()
        require_owner(conn, session_id, owner, generation)
        conn.execute(
            "UPDATE sessions SET status = 'running', result = NULL, finished_at = NULL,"
            " updated_at = ? WHERE id = ?",
            (now, session_id),
        )
        return _must_get(conn, session_id)


def orphaned_sessions(conn: sqlite3.Connection, clock: Clock, limit: int) -> list[SessionRecord]:
    """Running sessions without a live lease, oldest first."""
    rows = conn.execute(
        f"{_SESSION} WHERE status = 'running' AND (owner IS NULL OR lease_expires_at <= ?)"
        " ORDER BY created_at, id LIMIT ?",
        (clock(), limit),
    ).fetchall()
    return [session_from_row(row) for row in rows]


# --- ownership --------------------------------------------------------------------------------


def claim(
    conn: sqlite3.Connection, clock: Clock, session_id: str, owner: str, lease_s: float
) -> bool:
    """Take the session if unowned, expired or already *owner*'s (a new generation unless so)."""
    with transaction(conn):
        now = clock()
        holder, expires, generation = _owner_of(conn, session_id)
        if holder is not None and holder != owner and expires is not None and expires > now:
            return False
        conn.execute(
            "UPDATE sessions SET owner = ?, lease_expires_at = ?, updated_at = ?, generation = ?"
            " WHERE id = ?",
            (owner, now + lease_s, now, generation + (holder != owner), session_id),
        )
        return True


def renew(
    conn: sqlite3.Connection,
    clock: Clock,
    session_id: str,
    owner: str,
    lease_s: float,
    generation: int | None = None,
) -> bool:
    """Extend *owner*'s lease; False when it does not hold the session (at *generation*)."""
    with transaction(conn):
        now = clock()
        if not holds(conn, session_id, owner, generation):
            return False
        conn.execute(
            "UPDATE sessions SET lease_expires_at = ?, updated_at = ? WHERE id = ?",
            (now + lease_s, now, session_id),
        )
        return True


def release(
    conn: sqlite3.Connection,
    clock: Clock,
    session_id: str,
    owner: str,
    generation: int | None = None,
) -> bool:
    """Clear *owner*'s hold; False when it did not hold the session (at *generation*)."""
    with transaction(conn):
        if not holds(conn, session_id, owner, generation):
            return False
        conn.execute(
            "UPDATE sessions SET owner = NULL, lease_expires_at = NULL, updated_at = ?"
            " WHERE id = ?",
            (clock(), session_id),
        )
        return True


# --- the event log ----------------------------------------------------------------------------


def _last_seq(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute("SELECT max(seq) FROM events WHERE session_id = ?", (session_id,)).fetchone()
    return int(row[0] or 0)


def append(
    conn: sqlite3.Connection,
    session_id: str,
    rows: Sequence[EventRow],
    owner: str,
    generation: int | None = None,
) -> int:
    """Insert *rows* if *owner* holds the session and their seqs continue the log."""
    with transaction(conn):
        require_owner(conn, session_id, owner, generation)
        last = _last_seq(conn, session_id)
        seqs = [row[0] for row in rows]
        if seqs != list(range(last + 1, last + 1 + len(rows))):
            raise StoreConflictError(
                f"session {session_id!r}: events must continue from seq {last + 1},"
                f" got seqs {seqs[:5]}{' ...' if len(seqs) > 5 else ''}",
                reason="seq",
                session_id=session_id,
                last_seq=last,
            )
        conn.executemany(
            "INSERT INTO events (session_id, seq, kind, payload, ts) VALUES (?, ?, ?, ?, ?)",
            [(session_id, *row) for row in rows],
        )
        return last + len(rows)


def events(
    conn: sqlite3.Connection, session_id: str, after_seq: int, limit: int | None
) -> list[StoredEvent]:
    """Events after *after_seq*, in order, at most *limit*."""
    rows = conn.execute(
        "SELECT seq, kind, payload, ts FROM events WHERE session_id = ? AND seq > ?"
        " ORDER BY seq LIMIT ?",
        (session_id, after_seq, -1 if limit is None else limit),
    ).fetchall()
    return [
        StoredEvent(session_id=session_id, seq=seq, kind=kind, payload=decode(payload), ts=ts)
        for seq, kind, payload, ts in rows
    ]


def last_seq(conn: sqlite3.Connection, session_id: str) -> int:
    """The last seq (0 when none); StoreNotFoundError for no session."""
    row = conn.execute(
        "SELECT (SELECT max(seq) FROM events WHERE session_id = s.id) FROM sessions AS s"
        " WHERE s.id = ?",
        (session_id,),
    ).fetchone()
    if row is None:
        raise StoreNotFoundError(f"no session {session_id!r}")
    return int(row[0] or 0)


# --- retention --------------------------------------------------------------------------------


def purge(conn: sqlite3.Connection, older_than_s: float, now: float) -> int:
    """Delete unleased, non-running sessions finished before now - *older_than_s*."""
    total = 0
    while True:
        with transaction(conn):
            ids = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM sessions WHERE status != 'running' AND finished_at < ?"
                    " AND (owner IS NULL OR lease_expires_at <= ?) LIMIT ?",
                    (now - older_than_s, now, _PURGE_BATCH),
                )
            ]
            if not ids:
                return total
            conn.executemany("DELETE FROM sessions WHERE id = ?", [(i,) for i in ids])
        total += len(ids)
