"""The embedded default store: :class:`SQLiteStore`, one SQLite file, no setup.

All database work for one store runs on one dedicated thread (a single-worker executor), so
no call blocks the event loop and a store's writes are serialised; several stores (in one
process or many) may share a file, and SQLite's locks keep them correct. The file is opened in
WAL mode (readers never block the writer, nor it them) with ``synchronous=FULL`` (a commit is on
disk before the write returns), ``foreign_keys=ON`` and a busy timeout (a writer waits that long
for another process's write lock before failing with :class:`StoreError`).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Self, TypeVar, final

from sunroom.errors import ClosedError, StoreError, UsageError
from sunroom.store import callrecords, queries, replicas
from sunroom.store.migrations import migrate
from sunroom.store.records import (
    CALL_OUTCOMES,
    SESSION_STATUSES,
    CallOutcome,
    CallRecord,
    JSONObject,
    KernelPlacement,
    NewEvent,
    ReplicaRecord,
    SessionRecord,
    SessionStatus,
    StoredEvent,
)
from sunroom.store.validation import age, count, event_row, fence, flag, positive, text

if TYPE_CHECKING:
    from sunroom.store.seam import EventStore

__all__ = ["SQLiteStore"]

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], T]


@final
class SQLiteStore:
    """An :class:`~sunroom.store.seam.EventStore` in one SQLite file.

    ``async with SQLiteStore(path) as store: ...`` (or ``store = await SQLiteStore.open(path)``
    and later ``await store.aclose()``, which the caller must do). Opening creates the file
    (mode 0600) and its directory when missing, and migrates the schema; it raises
    StoreVersionError when the file was written by a newer sunroom and StoreError when it is
    not a usable SQLite database (or cannot use WAL, e.g. on a network filesystem).

    Args:
        path: the database file. Its ``-wal`` and ``-shm`` companions live beside it.
        clock: the time source for leases and timestamps (``time.time``; tests inject one).
        busy_timeout_s: how long a write waits for another connection's write lock.

    A coroutine cancelled while its write is under way does not undo it: the write completes
    (or fails) on the store's thread. Every method is documented on ``EventStore``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.path = Path(path).expanduser()
        self.clock = clock
        self._busy_timeout_s = positive(busy_timeout_s, "busy_timeout_s")
        self._state: Literal["new", "opening", "open", "closed"] = "new"
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r}, {self._state})"

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 10.0,
    ) -> SQLiteStore:
        """An opened store; the caller must ``await store.aclose()``."""
        store = cls(path, clock=clock, busy_timeout_s=busy_timeout_s)
        await store._open()
        return store

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _open(self) -> None:
        if self._state == "closed":
            raise ClosedError("the store is closed")
        if self._state == "open":
            return
        if self._state == "opening":
            raise UsageError("the store is already being opened by another task")
        self._state = "opening"
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sunroom-store")
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._connect)
        except BaseException:
            self._state = "closed"
            executor.submit(self._disconnect)  # after _connect, even if we were cancelled
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        self._state = "open"

    def _connect(self) -> None:
        """On the store's thread: open, configure and migrate the database."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the store {str(self.path)!r}: {exc}") from exc
        self._conn = conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            mode = _wal(conn, self._busy_timeout_s)
            if mode.lower() != "wal":
                raise StoreError(
                    f"the store {str(self.path)!r} cannot use WAL mode (got {mode!r});"
                    " put it on a local filesystem"
                )
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {str(self.path)!r}: {exc}") from exc

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        """Close the database and stop the store's thread; idempotent."""
        executor, self._executor = self._executor, None
        self._state = "closed"
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
        finally:
            executor.shutdown(wait=False)

    async def _run(self, job: Job[T]) -> T:
        if self._state != "open" or self._executor is None:
            if self._state in ("new", "opening"):
                raise UsageError("the store is not open: use `async with` or SQLiteStore.open")
            raise ClosedError("the store is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._guard, job)

    def _guard(self, job: Job[T]) -> T:
        """On the store's thread: run *job*, translating SQLite's errors to StoreError."""
        conn = self._conn
        if conn is None:  # pragma: no cover - jobs are queued before the close job
            raise ClosedError("the store is closed")
        try:
            return job(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"store {str(self.path)!r}: {exc}") from exc

    # --- sessions -----------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str,
        *,
        config: JSONObject,
        created_at: float | None = None,
        owner: str | None = None,
        lease_s: float | None = None,
    ) -> SessionRecord:
        """See ``EventStore.create_session``."""
        sid = text(session_id, "session_id")
        if (owner is None) != (lease_s is None):
            raise UsageError("owner and lease_s go together: give both or neither")
        if owner is not None:
            text(owner, "owner")
        lease = None if lease_s is None else positive(lease_s, "lease_s")
        if created_at is not None:
            positive(created_at, "created_at")
        return await self._run(
            lambda c: queries.create_session(
                c, self.clock, sid, queries.encode(config, "config"), created_at, owner, lease
            )
        )

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """See ``EventStore.get_session``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: queries.get_session(c, sid))

    async def list_sessions(
        self, *, status: SessionStatus | None = None, limit: int = 100
    ) -> list[SessionRecord]:
        """See ``EventStore.list_sessions``."""
        if status is not None and status not in SESSION_STATUSES:
            raise UsageError(f"status must be one of {', '.join(SESSION_STATUSES)}")
        n = count(limit, "limit", minimum=1)
        return await self._run(lambda c: queries.list_sessions(c, status, n))

    async def finish_session(
        self,
        session_id: str,
        *,
        status: SessionStatus,
        result: JSONObject | None,
        owner: str | None = None,
        generation: int | None = None,
    ) -> SessionRecord:
        """See ``EventStore.finish_session``."""
        gen = fence(generation)
        sid = text(session_id, "session_id")
        if status == "running" or status not in SESSION_STATUSES:
            raise UsageError(
                f"status must be one of {', '.join(SESSION_STATUSES[1:])}, got {status!r}"
                " (use reopen_session to run again)"
            )
        if owner is not None:
            text(owner, "owner")
        return await self._run(
            lambda c: queries.finish_session(
                c,
                self.clock,
                sid,
                status,
                None if result is None else queries.encode(result, "result"),
                owner,
                gen,
            )
        )

    async def reopen_session(
        self, session_id: str, *, owner: str, generation: int | None = None
    ) -> SessionRecord:
        """See ``EventStore.reopen_session``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        gen = fence(generation)
        return await self._run(lambda c: queries.reopen_session(c, self.clock, sid, who, gen))

    async def orphaned_sessions(self, *, limit: int = 100) -> list[SessionRecord]:
        """See ``EventStore.orphaned_sessions``."""
        n = count(limit, "limit", minimum=1)
        return await self._run(lambda c: queries.orphaned_sessions(c, self.clock, n))

    # --- ownership ----------------------------------------------------------------------------

    async def claim(self, session_id: str, *, owner: str, lease_s: float) -> bool:
        """See ``EventStore.claim``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        lease = positive(lease_s, "lease_s")
        return await self._run(lambda c: queries.claim(c, self.clock, sid, who, lease))

    async def renew(
        self, session_id: str, *, owner: str, lease_s: float, generation: int | None = None
    ) -> bool:
        """See ``EventStore.renew``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        lease, gen = positive(lease_s, "lease_s"), fence(generation)
        return await self._run(lambda c: queries.renew(c, self.clock, sid, who, lease, gen))

    async def release(self, session_id: str, *, owner: str, generation: int | None = None) -> bool:
        """See ``EventStore.release``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        gen = fence(generation)
        return await self._run(lambda c: queries.release(c, self.clock, sid, who, gen))

    # --- the event log ------------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        *,
        owner: str,
        generation: int | None = None,
    ) -> int:
        """See ``EventStore.append``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        gen = fence(generation)
        rows = [event_row(event) for event in events]

        def job(conn: sqlite3.Connection) -> int:
            encoded = [
                (seq, kind, queries.encode(payload, f"payload of event {seq}"), ts)
                for seq, kind, payload, ts in rows
            ]
            return queries.append(conn, sid, encoded, who, gen)

        return await self._run(job)

    async def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        """See ``EventStore.events``."""
        sid = text(session_id, "session_id")
        after = count(after_seq, "after_seq", minimum=0)
        n = None if limit is None else count(limit, "limit", minimum=1)
        return await self._run(lambda c: queries.events(c, sid, after, n))

    async def last_seq(self, session_id: str) -> int:
        """See ``EventStore.last_seq``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: queries.last_seq(c, sid))

    # --- call records -------------------------------------------------------------------------

    async def record_call_started(
        self,
        session_id: str,
        call_id: str,
        *,
        name: str,
        args: JSONObject,
        side_effect: bool,
        owner: str,
        generation: int | None = None,
    ) -> CallRecord:
        """See ``EventStore.record_call_started``."""
        sid, cid = text(session_id, "session_id"), text(call_id, "call_id")
        fn, who = text(name, "name"), text(owner, "owner")
        gen = fence(generation)
        if not isinstance(side_effect, bool):
            raise UsageError(f"side_effect must be a bool, got {side_effect!r}")
        return await self._run(
            lambda c: callrecords.start_call(
                c, self.clock, sid, cid, fn, queries.encode(args, "args"), side_effect, who, gen
            )
        )

    async def record_call_finished(
        self,
        session_id: str,
        call_id: str,
        *,
        outcome: CallOutcome,
        result: JSONObject,
        owner: str,
        generation: int | None = None,
    ) -> CallRecord:
        """See ``EventStore.record_call_finished``."""
        sid, cid = text(session_id, "session_id"), text(call_id, "call_id")
        who, gen = text(owner, "owner"), fence(generation)
        if outcome not in CALL_OUTCOMES[:2]:
            raise UsageError(f"outcome must be 'ok' or 'error', got {outcome!r}")
        return await self._run(
            lambda c: callrecords.finish_call(
                c, self.clock, sid, cid, outcome, queries.encode(result, "result"), who, gen
            )
        )

    async def mark_unknown(
        self, session_id: str, call_id: str, *, owner: str, generation: int | None = None
    ) -> CallRecord:
        """See ``EventStore.mark_unknown``."""
        sid, cid = text(session_id, "session_id"), text(call_id, "call_id")
        who, gen = text(owner, "owner"), fence(generation)
        return await self._run(
            lambda c: callrecords.finish_call(c, self.clock, sid, cid, "unknown", None, who, gen)
        )

    async def get_call(self, session_id: str, call_id: str) -> CallRecord | None:
        """See ``EventStore.get_call``."""
        sid, cid = text(session_id, "session_id"), text(call_id, "call_id")
        return await self._run(lambda c: callrecords.get_call(c, sid, cid))

    async def calls(self, session_id: str) -> list[CallRecord]:
        """See ``EventStore.calls``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: callrecords.calls(c, sid, unfinished=False))

    async def unfinished_calls(self, session_id: str) -> list[CallRecord]:
        """See ``EventStore.unfinished_calls``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: callrecords.calls(c, sid, unfinished=True))

    # --- retention ----------------------------------------------------------------------------

    async def purge(self, *, older_than_s: float, now: float | None = None) -> int:
        """See ``EventStore.purge``."""
        older = age(older_than_s)
        if now is not None:
            positive(now, "now")
        return await self._run(
            lambda c: queries.purge(c, older, self.clock() if now is None else now)
        )

    # --- replicas -----------------------------------------------------------------------------

    async def heartbeat(
        self,
        replica_id: str,
        *,
        url: str,
        load: int,
        capacity: int,
        draining: bool,
        ttl_s: float,
    ) -> ReplicaRecord:
        """See ``EventStore.heartbeat``."""
        rid, where = text(replica_id, "replica_id"), text(url, "url")
        n, cap = count(load, "load", minimum=0), count(capacity, "capacity", minimum=0)
        drains, ttl = flag(draining, "draining"), positive(ttl_s, "ttl_s")
        return await self._run(
            lambda c: replicas.heartbeat(c, self.clock, rid, where, n, cap, drains, ttl)
        )

    async def replicas(self) -> list[ReplicaRecord]:
        """See ``EventStore.replicas``."""
        return await self._run(lambda c: replicas.replicas(c, self.clock))

    async def get_replica(self, replica_id: str) -> ReplicaRecord | None:
        """See ``EventStore.get_replica``."""
        rid = text(replica_id, "replica_id")
        return await self._run(lambda c: replicas.get_replica(c, self.clock, rid))

    async def leave(self, replica_id: str) -> bool:
        """See ``EventStore.leave``."""
        rid = text(replica_id, "replica_id")
        return await self._run(lambda c: replicas.leave(c, rid))

    # --- kernel placement ---------------------------------------------------------------------

    async def place_kernel(self, kernel_id: str, *, replica_id: str) -> KernelPlacement:
        """See ``EventStore.place_kernel``."""
        kid, rid = text(kernel_id, "kernel_id"), text(replica_id, "replica_id")
        return await self._run(lambda c: replicas.place_kernel(c, self.clock, kid, rid))

    async def kernel_placement(self, kernel_id: str) -> KernelPlacement | None:
        """See ``EventStore.kernel_placement``."""
        kid = text(kernel_id, "kernel_id")
        return await self._run(lambda c: replicas.kernel_placement(c, kid))

    async def forget_kernel(self, kernel_id: str) -> bool:
        """See ``EventStore.forget_kernel``."""
        kid = text(kernel_id, "kernel_id")
        return await self._run(lambda c: replicas.forget_kernel(c, kid))

    async def kernels_of(self, replica_id: str) -> list[KernelPlacement]:
        """See ``EventStore.kernels_of``."""
        rid = text(replica_id, "replica_id")
        return await self._run(lambda c: replicas.kernels_of(c, rid))


if TYPE_CHECKING:

    def _conforms(store: SQLiteStore) -> EventStore:
        """A type check (for mypy): SQLiteStore provides the whole EventStore seam."""
        return store


def _wal(conn: sqlite3.Connection, within_s: float) -> str:
    """Switch *conn*'s database to WAL; the journal mode it is in afterwards.

    Switching needs the file to itself for a moment. When several processes open a fresh file
    at once, SQLite answers BUSY at once, without waiting out the busy timeout, to one that
    already reads the file while another waits to write (waiting could deadlock): that one
    tries again, until *within_s* have passed. Raises sqlite3.Error otherwise.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return str(mode)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)
