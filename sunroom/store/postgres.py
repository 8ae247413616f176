"""The shared store: :class:`PostgresStore`, sessions in a PostgreSQL database.

Needs the ``postgres`` extra (psycopg 3 and psycopg-pool). Several processes (service replicas
on several hosts) may share one database; every guarantee of
:class:`~sunroom.store.seam.EventStore` holds across them.

**Transactions and locking.** Each write is one ``READ COMMITTED`` transaction on a pooled
connection that starts by locking the session's row (``SELECT ... FOR UPDATE``), then checks
(owner, generation, last seq) with fresh statements and writes. Writers of one session queue on
that row lock, in whatever process they run, so each read-check-write is atomic: of racing
claimants exactly one wins, an append never leaves a gap, and a fenced-off owner writes nothing.
Chosen over ``SERIALIZABLE`` with retries because every write touches one known row: the lock
makes the queue explicit, and no write is ever retried (a retry of a write whose commit was
lost could do it twice). Uniqueness is also the schema's (primary keys, ``UNIQUE`` call ids).

**Clock.** Lease expiries and timestamps come from the store's ``clock`` (``time.time``;
injectable), read in Python once the row lock is held and passed as parameters; SQL never
calls ``now()``. Leases therefore compare the clocks of the processes sharing the database:
keep them synchronised (NTP).

**Notifications.** :meth:`PostgresStore.append` notifies the channel ``sunroom_events`` with
the session id inside its transaction (delivered only if it commits);
:meth:`PostgresStore.follow` LISTENs on a connection of its own (outside the pool) and
reconnects, with backoff, when that connection is lost (see
:class:`~sunroom.store.seam.AppendFollower`).

**Errors.** A psycopg error becomes :class:`~sunroom.errors.StoreError` naming the server as
``host:port/dbname``; no message ever contains the DSN or its password. A write whose
coroutine is cancelled is rolled back unless its commit was already sent (SQLite's completes).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Self, TypeVar, final

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from sunroom.errors import ClosedError, StoreError, UsageError
from sunroom.store import pg_callrecords, pg_queries, pg_replicas, queries
from sunroom.store.pg_migrations import migrate
from sunroom.store.pg_queries import CHANNEL, Conn
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
    from sunroom.store.seam import AppendFollower, EventStore

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[Conn], Awaitable[T]]

_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0


@final
class PostgresStore:
    """An :class:`~sunroom.store.seam.EventStore` (and AppendFollower) in a PostgreSQL database.

    ``async with PostgresStore(dsn) as store: ...`` (or ``store = await
    PostgresStore.open(dsn)`` and later ``await store.aclose()``, which the caller must do).
    Opening connects once, migrates the schema (see :mod:`sunroom.store.pg_migrations`), then
    opens the pool; it raises StoreVersionError when the database was written by a newer
    sunroom and StoreError when the server cannot be reached or refuses the login.

    Args:
        dsn: a libpq connection string, ``postgresql://user:password@host:5432/dbname`` or
            ``host=... dbname=...``; it is never echoed (errors name ``host:port/dbname``).
        clock: the time source for leases and timestamps (``time.time``; tests inject one).
        min_size / max_size: the connection pool's bounds (connections kept / at most).
        connect_timeout_s: how long opening, or a call waiting for a free connection, waits.
        schema: the schema holding the tables (created when missing).

    Attributes:
        where: the server and database as ``host:port/dbname``, what messages name.
        clock: the time source given.

    Every method is documented on ``EventStore``; :meth:`follow` on ``AppendFollower``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        clock: Callable[[], float] = time.time,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 10.0,
        schema: str = "public",
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise UsageError("the PostgreSQL DSN must be a non-empty str")
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error:
            raise UsageError(
                "the PostgreSQL DSN is not a valid libpq connection string or URL"
            ) from None  # its text may hold the password: not chained, not shown
        self._dsn = dsn
        password = str(params.get("password") or "")
        self._secrets = [s for s in {password, urllib.parse.quote(password, safe="")} if s]
        host = str(params.get("host") or params.get("hostaddr") or "localhost")
        port = str(params.get("port") or "5432")
        self.where = f"{host}:{port}/{params.get('dbname') or params.get('user') or ''}"
        self.clock = clock
        self._min = count(min_size, "min_size", minimum=0)
        self._max = count(max_size, "max_size", minimum=max(1, self._min))
        self._timeout_s = positive(connect_timeout_s, "connect_timeout_s")
        self._schema = text(schema, "schema")
        self._state: Literal["new", "opening", "open", "closed"] = "new"
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._listeners: set[Conn] = set()

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r}, {self._state})"

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        clock: Callable[[], float] = time.time,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 10.0,
        schema: str = "public",
    ) -> PostgresStore:
        """An opened store; the caller must ``await store.aclose()``."""
        store = cls(
            dsn,
            clock=clock,
            min_size=min_size,
            max_size=max_size,
            connect_timeout_s=connect_timeout_s,
            schema=schema,
        )
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

    # --- lifecycle ------------------------------------------------------------------------

    def _scrub(self, message: object) -> str:
        """*message* as one line, with the DSN's password (if any) blanked out."""
        line = " ".join(str(message).split())
        for secret in self._secrets:
            line = line.replace(secret, "***")
        return line

    def _error(self, exc: psycopg.Error, doing: str) -> StoreError | UsageError:
        if isinstance(exc, psycopg.DataError) and "NUL" in str(exc):
            return UsageError("PostgreSQL text cannot hold NUL characters ('\\x00')")
        return StoreError(f"PostgreSQL store {self.where}: {doing}: {self._scrub(exc)}")

    async def _connect(self, *, keepalive: bool = False) -> Conn:
        """A new connection outside the pool, in autocommit mode.

        With *keepalive*, TCP keepalives probe it after 30 s of silence, so a listener whose
        network path died (no reset ever comes) notices within about a minute.
        """
        probes = {"keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
        try:
            conn = await psycopg.AsyncConnection.connect(
                make_conninfo(self._dsn, **(probes if keepalive else {})),
                autocommit=True,
                connect_timeout=max(2, math.ceil(self._timeout_s)),
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to PostgreSQL at {self.where}: {self._scrub(exc)}"
            ) from None  # psycopg's exception may carry the DSN: not chained
        return conn

    async def _configure(self, conn: Conn) -> None:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self._schema)))

    async def _open(self) -> None:
        if self._state == "closed":
            raise ClosedError("the store is closed")
        if self._state == "open":
            return
        if self._state == "opening":
            raise UsageError("the store is already being opened by another task")
        self._state = "opening"
        pool: AsyncConnectionPool[Conn] | None = None
        try:
            conn = await self._connect()
            try:
                await migrate(conn, schema=self._schema)
            except psycopg.Error as exc:
                raise self._error(exc, "migrating the schema") from exc
            finally:
                await conn.close()
            pool = AsyncConnectionPool(
                self._dsn,
                min_size=self._min,
                max_size=self._max,
                kwargs={
                    "autocommit": True,
                    "connect_timeout": max(2, math.ceil(self._timeout_s)),
                },
                configure=self._configure,
                open=False,
                timeout=self._timeout_s,
                name="sunroom-store",
            )
            try:
                await pool.open(wait=True, timeout=self._timeout_s)
            except (psycopg.Error, PoolTimeout):
                raise StoreError(
                    f"cannot open a pool of connections to PostgreSQL at {self.where}"
                    f" within {self._timeout_s:g} s"
                ) from None
        except BaseException:
            self._state = "closed"
            if pool is not None:
                await pool.close()
            raise
        self._pool = pool
        self._state = "open"

    async def aclose(self) -> None:
        """Close the pool and any :meth:`follow` connection; idempotent."""
        pool, self._pool = self._pool, None
        self._state = "closed"
        for conn in list(self._listeners):
            await conn.close()
        if pool is not None:
            await pool.close()

    def _is_open(self) -> bool:
        return self._state == "open"

    def _check_open(self) -> AsyncConnectionPool[Conn]:
        if self._state != "open" or self._pool is None:
            if self._state in ("new", "opening"):
                raise UsageError("the store is not open: use `async with` or PostgresStore.open")
            raise ClosedError("the store is closed")
        return self._pool

    async def _run(self, job: Job[T]) -> T:
        """Run *job* on a pooled connection, translating psycopg's errors to StoreError."""
        pool = self._check_open()
        try:
            async with pool.connection() as conn:
                return await job(conn)
        except PoolClosed:
            raise ClosedError("the store is closed") from None
        except PoolTimeout:
            raise StoreError(
                f"PostgreSQL store {self.where}: no connection free within"
                f" {self._timeout_s:g} s (all {self._max} busy, or the server unreachable)"
            ) from None
        except psycopg.Error as exc:  # a server's message about a query: no DSN in it
            raise self._error(exc, "query failed") from exc

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
        encoded = queries.encode(config, "config")
        return await self._run(
            lambda c: pg_queries.create_session(
                c, self.clock, sid, encoded, created_at, owner, lease
            )
        )

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """See ``EventStore.get_session``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: pg_queries.get_session(c, sid))

    async def list_sessions(
        self, *, status: SessionStatus | None = None, limit: int = 100
    ) -> list[SessionRecord]:
        """See ``EventStore.list_sessions``."""
        if status is not None and status not in SESSION_STATUSES:
            raise UsageError(f"status must be one of {', '.join(SESSION_STATUSES)}")
        n = count(limit, "limit", minimum=1)
        return await self._run(lambda c: pg_queries.list_sessions(c, status, n))

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
        encoded = None if result is None else queries.encode(result, "result")
        return await self._run(
            lambda c: pg_queries.finish_session(c, self.clock, sid, status, encoded, owner, gen)
        )

    async def reopen_session(
        self, session_id: str, *, owner: str, generation: int | None = None
    ) -> SessionRecord:
        """See ``EventStore.reopen_session``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        gen = fence(generation)
        return await self._run(lambda c: pg_queries.reopen_session(c, self.clock, sid, who, gen))

    async def orphaned_sessions(self, *, limit: int = 100) -> list[SessionRecord]:
        """See ``EventStore.orphaned_sessions``."""
        n = count(limit, "limit", minimum=1)
        return await self._run(lambda c: pg_queries.orphaned_sessions(c, self.clock, n))

    # --- ownership ----------------------------------------------------------------------------

    async def claim(self, session_id: str, *, owner: str, lease_s: float) -> bool:
        """See ``EventStore.claim``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        lease = positive(lease_s, "lease_s")
        return await self._run(lambda c: pg_queries.claim(c, self.clock, sid, who, lease))

    async def renew(
        self, session_id: str, *, owner: str, lease_s: float, generation: int | None = None
    ) -> bool:
        """See ``EventStore.renew``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        lease, gen = positive(lease_s, "lease_s"), fence(generation)
        return await self._run(lambda c: pg_queries.renew(c, self.clock, sid, who, lease, gen))

    async def release(self, session_id: str, *, owner: str, generation: int | None = None) -> bool:
        """See ``EventStore.release``."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        gen = fence(generation)
        return await self._run(lambda c: pg_queries.release(c, self.clock, sid, who, gen))

    # --- the event log ------------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        *,
        owner: str,
        generation: int | None = None,
    ) -> int:
        """See ``EventStore.append``; also notifies ``sunroom_events`` (see :meth:`follow`)."""
        sid, who = text(session_id, "session_id"), text(owner, "owner")
        gen = fence(generation)
        rows = [event_row(event) for event in events]
        encoded = [
            (seq, kind, queries.encode(payload, f"payload of event {seq}"), ts)
            for seq, kind, payload, ts in rows
        ]
        return await self._run(lambda c: pg_queries.append(c, sid, encoded, who, gen))

    async def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        """See ``EventStore.events``."""
        sid = text(session_id, "session_id")
        after = count(after_seq, "after_seq", minimum=0)
        n = None if limit is None else count(limit, "limit", minimum=1)
        return await self._run(lambda c: pg_queries.events(c, sid, after, n))

    async def last_seq(self, session_id: str) -> int:
        """See ``EventStore.last_seq``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: pg_queries.last_seq(c, sid))

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
        encoded = queries.encode(args, "args")
        return await self._run(
            lambda c: pg_callrecords.start_call(
                c, self.clock, sid, cid, fn, encoded, side_effect, who, gen
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
        encoded = queries.encode(result, "result")
        return await self._run(
            lambda c: pg_callrecords.finish_call(
                c, self.clock, sid, cid, outcome, encoded, who, gen
            )
        )

    async def mark_unknown(
        self, session_id: str, call_id: str, *, owner: str, generation: int | None = None
    ) -> CallRecord:
        """See ``EventStore.mark_unknown``."""
        sid, cid = text(session_id, "session_id"), text(call_id, "call_id")
        who, gen = text(owner, "owner"), fence(generation)
        return await self._run(
            lambda c: pg_callrecords.finish_call(c, self.clock, sid, cid, "unknown", None, who, gen)
        )

    async def get_call(self, session_id: str, call_id: str) -> CallRecord | None:
        """See ``EventStore.get_call``."""
        sid, cid = text(session_id, "session_id"), text(call_id, "call_id")
        return await self._run(lambda c: pg_callrecords.get_call(c, sid, cid))

    async def calls(self, session_id: str) -> list[CallRecord]:
        """See ``EventStore.calls``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: pg_callrecords.calls(c, sid, unfinished=False))

    async def unfinished_calls(self, session_id: str) -> list[CallRecord]:
        """See ``EventStore.unfinished_calls``."""
        sid = text(session_id, "session_id")
        return await self._run(lambda c: pg_callrecords.calls(c, sid, unfinished=True))

    # --- retention ----------------------------------------------------------------------------

    async def purge(self, *, older_than_s: float, now: float | None = None) -> int:
        """See ``EventStore.purge``."""
        older = age(older_than_s)
        if now is not None:
            positive(now, "now")
        return await self._run(
            lambda c: pg_queries.purge(c, older, self.clock() if now is None else now)
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
            lambda c: pg_replicas.heartbeat(c, self.clock, rid, where, n, cap, drains, ttl)
        )

    async def replicas(self) -> list[ReplicaRecord]:
        """See ``EventStore.replicas``."""
        return await self._run(lambda c: pg_replicas.replicas(c, self.clock))

    async def get_replica(self, replica_id: str) -> ReplicaRecord | None:
        """See ``EventStore.get_replica``."""
        rid = text(replica_id, "replica_id")
        return await self._run(lambda c: pg_replicas.get_replica(c, self.clock, rid))

    async def leave(self, replica_id: str) -> bool:
        """See ``EventStore.leave``."""
        rid = text(replica_id, "replica_id")
        return await self._run(lambda c: pg_replicas.leave(c, rid))

    # --- kernel placement ---------------------------------------------------------------------

    async def place_kernel(self, kernel_id: str, *, replica_id: str) -> KernelPlacement:
        """See ``EventStore.place_kernel``."""
        kid, rid = text(kernel_id, "kernel_id"), text(replica_id, "replica_id")
        return await self._run(lambda c: pg_replicas.place_kernel(c, self.clock, kid, rid))

    async def kernel_placement(self, kernel_id: str) -> KernelPlacement | None:
        """See ``EventStore.kernel_placement``."""
        kid = text(kernel_id, "kernel_id")
        return await self._run(lambda c: pg_replicas.kernel_placement(c, kid))

    async def forget_kernel(self, kernel_id: str) -> bool:
        """See ``EventStore.forget_kernel``."""
        kid = text(kernel_id, "kernel_id")
        return await self._run(lambda c: pg_replicas.forget_kernel(c, kid))

    async def kernels_of(self, replica_id: str) -> list[KernelPlacement]:
        """See ``EventStore.kernels_of``."""
        rid = text(replica_id, "replica_id")
        return await self._run(lambda c: pg_replicas.kernels_of(c, rid))

    # --- append notifications -----------------------------------------------------------------

    async def follow(self, on_append: Callable[[str], None]) -> None:
        """See ``AppendFollower.follow``: LISTEN on a connection of its own until cancelled.

        Returns when the store is closed. A lost (or refused) connection is logged as a
        warning and tried again after 0.1 s, doubling up to 5 s; once listening again,
        ``on_append("*")`` is called. An exception raised by *on_append* ends the follow.
        """
        self._check_open()
        delay, missed = _BACKOFF_FIRST_S, False
        while self._is_open():
            try:
                conn = await self._connect(keepalive=True)
            except StoreError as exc:
                log.warning("%s; listening again in %.1f s", exc, delay)
            else:
                self._listeners.add(conn)
                try:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    if missed:
                        on_append("*")
                    delay, missed = _BACKOFF_FIRST_S, False
                    async for note in conn.notifies():
                        on_append(note.payload)
                except psycopg.Error as exc:
                    if not self._is_open():
                        return
                    log.warning(
                        "lost the LISTEN connection to PostgreSQL at %s (%s); listening again"
                        " in %.1f s",
                        self.where,
                        self._scrub(exc),
                        delay,
                        exc_info=True,  # a server's message about a session: no DSN in it
                    )
                finally:
                    self._listeners.discard(conn)
                    await conn.close()
            if not self._is_open():
                return
            missed = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX_S)


if TYPE_CHECKING:

    def _conforms(store: PostgresStore) -> EventStore:
        """A type check (for mypy): PostgresStore provides the whole EventStore seam."""
        return store

    def _follows(store: PostgresStore) -> AppendFollower:
        """A type check (for mypy): PostgresStore provides AppendFollower."""
        return store
