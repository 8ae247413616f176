"""The SQL of call records: one row per tool or host call, started once, finished once.

Same rules as :mod:`sunroom.store.queries`: blocking functions on the store's thread, each
write one ``BEGIN IMMEDIATE`` transaction that checks the caller owns the session.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from sunroom.errors import StoreConflictError, StoreNotFoundError
from sunroom.store.queries import Clock, decode, require_owner, transaction
from sunroom.store.records import CallOutcome, CallRecord

__all__ = ["call_from_row", "calls", "finish_call", "get_call", "start_call"]

_CALL: Final = (
    "SELECT session_id, call_id, name, args, side_effect, started_at, started_by, outcome,"
    " result, finished_at FROM calls"
)


def call_from_row(row: Sequence[Any]) -> CallRecord:
    """A call record from a row of ``_CALL``'s columns (JSON as text; both backends)."""
    return CallRecord(
        session_id=row[0],
        call_id=row[1],
        name=row[2],
        args=decode(row[3]),
        side_effect=bool(row[4]),
        started_at=row[5],
        started_by=row[6],
        outcome=row[7],
        result=None if row[8] is None else decode(row[8]),
        finished_at=row[9],
    )


def start_call(
    conn: sqlite3.Connection,
    clock: Clock,
    session_id: str,
    call_id: str,
    name: str,
    args: str,
    side_effect: bool,
    owner: str,
    generation: int | None = None,
) -> CallRecord:
    """Record a call's start; conflict when this call_id was started before."""
    with transaction(conn):
        now = clock()
        require_owner(conn, session_id, owner, generation)
        if get_call(conn, session_id, call_id) is not None:
            raise StoreConflictError(
                f"call {call_id!r} of session {session_id!r} was already started",
                reason="exists",
                session_id=session_id,
            )
        conn.execute(
            "INSERT INTO calls (session_id, call_id, name, args, side_effect, started_at,"
            " started_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (session_id, call_id, name, args, int(side_effect), now, owner),
        )
        return _must_get_call(conn, session_id, call_id)


def finish_call(
    conn: sqlite3.Connection,
    clock: Clock,
    session_id: str,
    call_id: str,
    outcome: CallOutcome,
    result: str | None,
    owner: str,
    generation: int | None = None,
) -> CallRecord:
    """Record a started call's one outcome; conflict when it has one or never started."""
    with transaction(conn):
        now = clock()
        require_owner(conn, session_id, owner, generation)
        row = conn.execute(
            "SELECT outcome FROM calls WHERE session_id = ? AND call_id = ?",
            (session_id, call_id),
        ).fetchone()
        if row is None:
            raise StoreConflictError(
                f"call {call_id!r} of session {session_id!r} was never started",
                reason="not_started",
                session_id=session_id,
            )
        if row[0] is not None:
            raise StoreConflictError(
                f"call {call_id!r} of session {session_id!r} already has outcome {row[0]!r}",
                reason="finished",
                session_id=session_id,
            )
        conn.execute(
            "UPDATE calls SET outcome = ?, result = ?, finished_at = ?"
            " WHERE session_id = ? AND call_id = ?",
            (outcome, result, now, session_id, call_id),
        )
        return _must_get_call(conn, session_id, call_id)


def get_call(conn: sqlite3.Connection, session_id: str, call_id: str) -> CallRecord | None:
    """The call's record, or None."""
    row = conn.execute(
        f"{_CALL} WHERE session_id = ? AND call_id = ?", (session_id, call_id)
    ).fetchone()
    return None if row is None else call_from_row(row)


def _must_get_call(conn: sqlite3.Connection, session_id: str, call_id: str) -> CallRecord:
    record = get_call(conn, session_id, call_id)
    if record is None:  # pragma: no cover - only after an insert in the same transaction
        raise StoreNotFoundError(f"no call {call_id!r} in session {session_id!r}")
    return record


def calls(conn: sqlite3.Connection, session_id: str, unfinished: bool) -> list[CallRecord]:
    """The session's calls (only those without an outcome when *unfinished*), start order."""
    where = " AND outcome IS NULL" if unfinished else ""
    rows = conn.execute(
        f"{_CALL} WHERE session_id = ?{where} ORDER BY rowid", (session_id,)
    ).fetchall()
    return [call_from_row(row) for row in rows]
