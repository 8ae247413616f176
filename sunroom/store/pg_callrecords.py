"""The PostgreSQL SQL of call records: one row per tool or host call, started once, finished once.

Same rules as :mod:`sunroom.store.pg_queries`: each write one transaction that first locks the
session's row and checks the caller owns it. A call's uniqueness is also the table's
(``UNIQUE (session_id, call_id)``): a second start is refused even by the database itself.
"""

from __future__ import annotations

from typing import Final

from sunroom.errors import StoreConflictError, StoreNotFoundError
from sunroom.store.callrecords import call_from_row
from sunroom.store.pg_queries import Conn, require_owner
from sunroom.store.queries import Clock
from sunroom.store.records import CallOutcome, CallRecord

__all__ = ["calls", "finish_call", "get_call", "start_call"]

_CALL: Final = (
    "SELECT session_id, call_id, name, args::text, side_effect, started_at, started_by,"
    " outcome, result::text, finished_at FROM calls"
)


async def start_call(
    conn: Conn,
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
    async with conn.transaction():
        await require_owner(conn, session_id, owner, generation)
        cursor = await conn.execute(
            "INSERT INTO calls (session_id, call_id, name, args, side_effect, started_at,"
            " started_by) VALUES (%s, %s, %s, %s::json, %s, %s, %s)"
            " ON CONFLICT (session_id, call_id) DO NOTHING",
            (session_id, call_id, name, args, side_effect, clock(), owner),
        )
        if cursor.rowcount == 0:
            raise StoreConflictError(
                f"call {call_id!r} of session {session_id!r} was already started",
                reason="exists",
                session_id=session_id,
            )
        return await _must_get_call(conn, session_id, call_id)


async def finish_call(
    conn: Conn,
    clock: Clock,
    session_id: str,
    call_id: str,
    outcome: CallOutcome,
    result: str | None,
    owner: str,
    generation: int | None = None,
) -> CallRecord:
    """Record a started call's one outcome; conflict when it has one or never started."""
    async with conn.transaction():
        await require_owner(conn, session_id, owner, generation)
        cursor = await conn.execute(
            "SELECT outcome FROM calls WHERE session_id = %s AND call_id = %s",
            (session_id, call_id),
        )
        row = await cursor.fetchone()
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
        await conn.execute(
            "UPDATE calls SET outcome = %s, result = %s::json, finished_at = %s"
            " WHERE session_id = %s AND call_id = %s",
            (outcome, result, clock(), session_id, call_id),
        )
        return await _must_get_call(conn, session_id, call_id)


async def get_call(conn: Conn, session_id: str, call_id: str) -> CallRecord | None:
    """The call's record, or None."""
    cursor = await conn.execute(
        f"{_CALL} WHERE session_id = %s AND call_id = %s", (session_id, call_id)
    )
    row = await cursor.fetchone()
    return None if row is None else call_from_row(row)


async def _must_get_call(conn: Conn, session_id: str, call_id: str) -> CallRecord:
    record = await get_call(conn, session_id, call_id)
    if record is None:  # pragma: no cover - only after an insert in the same transaction
        raise StoreNotFoundError(f"no call {call_id!r} in session {session_id!r}")
    return record


async def calls(conn: Conn, session_id: str, unfinished: bool) -> list[CallRecord]:
    """The session's calls (only those without an outcome when *unfinished*), start order."""
    where = " AND outcome IS NULL" if unfinished else ""
    cursor = await conn.execute(
        f"{_CALL} WHERE session_id = %s{where} ORDER BY position", (session_id,)
    )
    return [call_from_row(row) for row in await cursor.fetchall()]
