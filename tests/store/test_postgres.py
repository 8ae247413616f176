"""PostgresStore itself: migrations, races between stores (pools), LISTEN/NOTIFY, its errors.

Every test has a fresh database of the worker's scratch cluster (``postgres_db_dsn``, as the
password role); ``postgres_dsn`` is the cluster's superuser, for what the role may not do.
"""

from __future__ import annotations

import asyncio
import socket
import time
from contextlib import AsyncExitStack

import psycopg
import pytest

from benchmarks._pg import Cluster
from sunroom.errors import ClosedError, UsageError
from sunroom.store import (
    NewEvent,
    PostgresStore,
    StoreConflictError,
    StoreError,
    StoreVersionError,
)
from sunroom.store.pg_migrations import PG_MIGRATIONS, migrate
from tests.store.conftest import FakeClock, batch

LATEST = PG_MIGRATIONS[-1][0]


def _versions(dsn: str, schema: str = "public") -> list[tuple[int, float]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT version, applied_at FROM "{schema}".schema_version ORDER BY 1')
        return [(int(v), float(at)) for v, at in rows.fetchall()]


def _tables(dsn: str, schema: str = "public") -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        )
        return {str(r[0]) for r in rows.fetchall()}


def _other_database(dsn: str, name: str) -> str:
    return dsn.rsplit("/", 1)[0] + "/" + name


# --- migrations -------------------------------------------------------------------------------


async def test_opening_migrates_a_fresh_database_once(postgres_db_dsn: str) -> None:
    async with PostgresStore(postgres_db_dsn) as store:
        await store.create_session("s1", config={"a": [1, 2.5]})
    versions = _versions(postgres_db_dsn)
    assert [v for v, _ in versions] == list(range(1, LATEST + 1))
    assert {"sessions", "events", "calls", "replicas", "kernels", "schema_version"} <= _tables(
        postgres_db_dsn
    )
    async with PostgresStore(postgres_db_dsn) as store:  # reopening applies nothing
        record = await store.get_session("s1")
        assert record is not None and record.config == {"a": [1, 2.5]}
    assert _versions(postgres_db_dsn) == versions


async def test_a_newer_schema_is_refused_and_left_alone(postgres_db_dsn: str) -> None:
    async with PostgresStore(postgres_db_dsn):
        pass
    with psycopg.connect(postgres_db_dsn) as conn:
        conn.execute("INSERT INTO schema_version VALUES (%s, 0)", (LATEST + 1,))
    store = PostgresStore(postgres_db_dsn)
    with pytest.raises(StoreVersionError, match=r"newer than this sunroom's .*upgrade sunroom"):
        await store.__aenter__()
    with pytest.raises(ClosedError):  # a failed open leaves a closed store
        await store.get_session("s1")
    assert [v for v, _ in _versions(postgres_db_dsn)] == list(range(1, LATEST + 2))


async def test_migration_2_gives_owned_sessions_generation_1(postgres_db_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_db_dsn, autocommit=True) as conn:
        assert await migrate(conn, PG_MIGRATIONS[:1]) == 1
        await conn.execute(
            "INSERT INTO sessions (id, status, config, created_at, updated_at, owner,"
            " lease_expires_at) VALUES ('owned', 'running', '{}', 1, 1, 'a', 5),"
            " ('free', 'running', '{}', 1, 1, NULL, NULL)"
        )
    async with PostgresStore(postgres_db_dsn) as store:
        owned, free = await store.get_session("owned"), await store.get_session("free")
        assert owned is not None and owned.generation == 1 and owned.owner == "a"
        assert free is not None and free.generation == 0


async def test_a_failing_migration_applies_nothing(postgres_db_dsn: str) -> None:
    bad = [*PG_MIGRATIONS, (LATEST + 1, "CREATE TABLE extra (x int); THIS IS NOT SQL;")]
    async with await psycopg.AsyncConnection.connect(postgres_db_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.SyntaxError):
            await migrate(conn, bad)
        for wrong in ([(2, "")], [(1, ""), (3, "")]):
            with pytest.raises(ValueError, match="numbered"):
                await migrate(conn, wrong)
    assert "extra" not in _tables(postgres_db_dsn)
    assert "sessions" not in _tables(postgres_db_dsn), "all or nothing: not even migration 1"


async def test_stores_racing_to_migrate_a_fresh_database_all_open(postgres_db_dsn: str) -> None:
    stores = [PostgresStore(postgres_db_dsn) for _ in range(6)]
    async with AsyncExitStack() as stack:
        await asyncio.gather(*(stack.enter_async_context(s) for s in stores))
        await stores[0].create_session("s1", config={})
        assert all([await s.get_session("s1") is not None for s in stores])
    assert [v for v, _ in _versions(postgres_db_dsn)] == list(range(1, LATEST + 1))


async def test_a_schema_of_its_own(postgres_db_dsn: str) -> None:
    async with PostgresStore(postgres_db_dsn, schema="sunroom Test") as store:
        await store.create_session("s1", config={}, owner="me", lease_s=5)
        assert await store.append("s1", batch(1, 2), owner="me") == 2
    assert "events" in _tables(postgres_db_dsn, "sunroom Test")
    assert "events" not in _tables(postgres_db_dsn)
    assert len(_versions(postgres_db_dsn, "sunroom Test")) == LATEST


# --- races between stores (separate pools) ---------------------------------------------------


async def test_many_stores_claiming_at_once_have_one_winner(postgres_db_dsn: str) -> None:
    past = FakeClock(time.time() - 3600)  # the leases it grants have long expired
    async with (
        PostgresStore(postgres_db_dsn) as setup,
        PostgresStore(postgres_db_dsn, clock=past) as dead,
    ):
        for i in range(30):
            await setup.create_session(f"s{i}", config={})
            if i % 2:  # a dead owner's session: the take-over race
                assert await dead.claim(f"s{i}", owner="dead", lease_s=60)
        async with AsyncExitStack() as stack:
            stores = [
                await stack.enter_async_context(PostgresStore(postgres_db_dsn, max_size=2))
                for _ in range(8)
            ]
            for i in range(30):
                won = await asyncio.gather(
                    *(s.claim(f"s{i}", owner=f"o{n}", lease_s=60) for n, s in enumerate(stores))
                )
                assert won.count(True) == 1, (i, won)
                record = await setup.get_session(f"s{i}")
                assert record is not None and record.owner == f"o{won.index(True)}"
                assert record.generation == (2 if i % 2 else 1)


async def test_concurrent_appenders_never_leave_a_gap(postgres_db_dsn: str) -> None:
    """Writers in separate stores append to one log, each from the last seq it read."""
    per_writer = 40
    async with PostgresStore(postgres_db_dsn) as setup:
        await setup.create_session("s1", config={}, owner="me", lease_s=600)
        async with AsyncExitStack() as stack:
            stores = [
                await stack.enter_async_context(PostgresStore(postgres_db_dsn)) for _ in range(5)
            ]
            refusals: list[str] = []

            async def write(n: int, store: PostgresStore) -> None:
                done = 0
                while done < per_writer:
                    last = await store.last_seq("s1")
                    events = [
                        NewEvent(seq=last + k, kind="w", payload={"by": n}, ts=0.0)
                        for k in (1, 2, 3)
                    ]
                    try:
                        await store.append("s1", events, owner="me")
                        done += 1
                    except StoreConflictError as exc:
                        refusals.append(exc.reason)

            await asyncio.gather(*(write(n, s) for n, s in enumerate(stores)))
        assert set(refusals) <= {"seq"}
        events = await setup.events("s1")
        assert [e.seq for e in events] == list(range(1, 5 * per_writer * 3 + 1))
        for first in range(0, len(events), 3):  # whole batches, one writer each
            assert len({e.payload["by"] for e in events[first : first + 3]}) == 1
        print(f"\n5 stores appended 200 batches to one log; {len(refusals)} seq conflicts retried")


async def test_cancelled_writes_are_whole_or_absent_and_the_store_goes_on(
    postgres_db_dsn: str,
) -> None:
    async with PostgresStore(postgres_db_dsn, max_size=3) as store:
        await store.create_session("s1", config={}, owner="me", lease_s=600)
        for delay in (0.0, 0.0005, 0.001, 0.002, 0.005):
            last = await store.last_seq("s1")
            task = asyncio.create_task(store.append("s1", batch(last + 1, 5), owner="me"))
            await asyncio.sleep(delay)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert (await store.last_seq("s1") - last) in (0, 5)
        last = await store.last_seq("s1")
        for _ in range(5):  # every pooled connection still works
            last = await store.append("s1", batch(last + 1, 1), owner="me")
        events = await store.events("s1")
        assert [e.seq for e in events] == list(range(1, last + 1))


# --- LISTEN/NOTIFY ----------------------------------------------------------------------------


async def _next(queue: asyncio.Queue[str], within_s: float = 1.0) -> str:
    return await asyncio.wait_for(queue.get(), within_s)


async def test_follow_hears_another_stores_appends_and_survives_a_lost_connection(
    postgres_db_dsn: str, postgres_dsn: str
) -> None:
    heard: asyncio.Queue[str] = asyncio.Queue()
    async with PostgresStore(postgres_db_dsn) as listener, PostgresStore(postgres_db_dsn) as writer:
        follower = asyncio.create_task(listener.follow(heard.put_nowait))
        try:
            await writer.create_session("s1", config={}, owner="me", lease_s=60)
            database = postgres_db_dsn.rsplit("/", 1)[1]
            listening = (
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN%%'"
            )
            async with await psycopg.AsyncConnection.connect(
                _other_database(postgres_dsn, "postgres"), autocommit=True
            ) as admin:
                for _ in range(200):  # until the follower listens
                    if await (await admin.execute(listening, (database,))).fetchall():
                        break
                    await asyncio.sleep(0.01)
                await writer.append("s1", batch(1, 2), owner="me")
                assert await _next(heard) == "s1"
                with pytest.raises(StoreConflictError):  # a refused append notifies nobody
                    await writer.append("s1", batch(1, 1), owner="me")
                await writer.append("s1", [], owner="me")  # nor does an empty one
                await writer.append("s1", batch(3, 1), owner="me")
                assert await _next(heard) == "s1"
                assert heard.empty()

                killed = await admin.execute(
                    f"SELECT pg_terminate_backend(pid) FROM ({listening}) AS l", (database,)
                )
                assert [row[0] for row in await killed.fetchall()] == [True]
                assert await _next(heard, 5.0) == "*", (
                    "a lost connection: anything may have changed"
                )
            await writer.append("s1", batch(4, 1), owner="me")
            assert await _next(heard) == "s1"
        finally:
            follower.cancel()
            with pytest.raises(asyncio.CancelledError):
                await follower


async def test_follow_ends_when_the_store_closes(postgres_db_dsn: str) -> None:
    store = await PostgresStore.open(postgres_db_dsn)
    follower = asyncio.create_task(store.follow(lambda _: None))
    await asyncio.sleep(0.2)
    await store.aclose()
    await asyncio.wait_for(follower, 5)
    with pytest.raises(ClosedError):
        await store.follow(lambda _: None)


# --- errors -----------------------------------------------------------------------------------


async def test_a_password_is_never_echoed(postgres_cluster: Cluster, postgres_db_dsn: str) -> None:
    secret = postgres_cluster.password
    assert secret in postgres_db_dsn
    async with PostgresStore(postgres_db_dsn) as store:  # the right password works
        await store.create_session("s1", config={})
        assert secret not in repr(store)
    wrong = postgres_db_dsn.replace(secret, "Wr0ng-" + secret[::-1])
    no_db = _other_database(postgres_db_dsn, "no_such_database")
    for dsn, expected in ((wrong, "password authentication failed"), (no_db, "does not exist")):
        with pytest.raises(StoreError) as info:
            await PostgresStore.open(dsn, connect_timeout_s=5)
        message = str(info.value)
        assert message.startswith(
            f"cannot connect to PostgreSQL at 127.0.0.1:{postgres_cluster.port}/"
        )
        assert expected in message
        assert secret not in message and secret[::-1] not in message
        assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(UsageError) as bad:
        PostgresStore(f"postgresql://u:{secret}@127.0.0.1:1/db?bogus_option=1")
    assert secret not in str(bad.value)


async def test_a_server_that_is_not_there(postgres_cluster: Cluster) -> None:
    with socket.socket() as s:  # a port the OS just handed out, closed: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(
        StoreError, match=rf"^cannot connect to PostgreSQL at 127.0.0.1:{port}/x: .*refused"
    ):
        await PostgresStore.open(f"postgresql://u:pw@127.0.0.1:{port}/x", connect_timeout_s=5)
    assert time.monotonic() - started < 5


async def test_a_connection_the_server_dropped_fails_one_call_then_is_replaced(
    postgres_db_dsn: str, postgres_dsn: str
) -> None:
    database = postgres_db_dsn.rsplit("/", 1)[1]
    async with PostgresStore(postgres_db_dsn, min_size=1, max_size=1) as store:
        await store.create_session("s1", config={})
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )
        with pytest.raises(StoreError, match=r"^PostgreSQL store 127.0.0.1:\d+/test_\w+: "):
            await store.get_session("s1")
        record = await store.get_session("s1")
        assert record is not None and record.session_id == "s1"


async def test_misuse(postgres_db_dsn: str) -> None:
    store = PostgresStore(postgres_db_dsn)
    with pytest.raises(UsageError, match="not open"):
        await store.list_sessions()
    for bad in ("", "   "):
        with pytest.raises(UsageError, match="non-empty"):
            PostgresStore(bad)
    with pytest.raises(UsageError, match="max_size"):
        PostgresStore(postgres_db_dsn, max_size=0)
    async with PostgresStore(postgres_db_dsn) as opened:
        with pytest.raises(UsageError, match="NUL"):
            await opened.create_session("a\x00b", config={})
        assert await opened.list_sessions() == []
