"""SQLiteStore itself: the file, its settings, migrations and the refusal of a newer schema."""

from __future__ import annotations

import sqlite3
import stat
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from sunroom.errors import ClosedError, UsageError
from sunroom.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    SQLiteStore,
    StoreError,
    StoreVersionError,
)
from sunroom.store.migrations import migrate, split_statements
from sunroom.store.sqlite import _wal


def _versions(path: Path) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        return [row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY 1")]


def _tables(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


async def test_opening_creates_and_migrates_a_fresh_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "store.db"
    async with SQLiteStore(path) as store:
        await store.create_session("s1", config={})
        for companion in (path, path.with_name("store.db-wal"), path.with_name("store.db-shm")):
            assert stat.S_IMODE(companion.stat().st_mode) == 0o600, companion
    assert _versions(path) == [v for v, _ in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    assert {"sessions", "events", "calls", "schema_version"} <= _tables(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    async with SQLiteStore(path) as store:  # reopening applies nothing twice
        assert await store.get_session("s1") is not None
    assert _versions(path) == list(range(1, SCHEMA_VERSION + 1))


async def test_connection_settings(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db", busy_timeout_s=2.5) as store:
        settings = await store._run(
            lambda c: [
                c.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            ]
        )
    assert settings == ["wal", 2, 1, 2500]  # synchronous 2 is FULL


async def test_a_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path):
        pass
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?, 0)", (SCHEMA_VERSION + 1,)
        )
    with pytest.raises(StoreVersionError, match=r"newer than this sunroom's .*upgrade sunroom"):
        async with SQLiteStore(path):
            pass  # pragma: no cover
    store = SQLiteStore(path)
    with pytest.raises(StoreVersionError):
        await store.__aenter__()
    with pytest.raises(ClosedError):  # a failed open leaves a closed store
        await store.get_session("s1")
    assert _versions(path)[-1] == SCHEMA_VERSION + 1


async def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not an sqlite file at all" * 100)
    with pytest.raises(StoreError, match="cannot open the store"):
        await SQLiteStore.open(path)


async def test_unopened_store_is_a_usage_error(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(UsageError, match="not open"):
        await store.list_sessions()
    await store.aclose()
    assert not (tmp_path / "s.db").exists()


def test_migrations_apply_in_order_and_record_each(tmp_path: Path) -> None:
    first = [(1, "CREATE TABLE a (x INTEGER);")]
    more = [*first, (2, "ALTER TABLE a ADD COLUMN y TEXT; CREATE TABLE b (z);"), (3, "")]
    with closing(sqlite3.connect(tmp_path / "m.db", isolation_level=None)) as conn:
        assert migrate(conn, first, now=5.0) == 1
        assert migrate(conn, first) == 1
        assert migrate(conn, more, now=6.0) == 3
        rows = conn.execute("SELECT version, applied_at FROM schema_version ORDER BY 1").fetchall()
        assert rows == [(1, 5.0), (2, 6.0), (3, 6.0)]
        assert [r[1] for r in conn.execute("PRAGMA table_info(a)")] == ["x", "y"]
        with pytest.raises(StoreVersionError):
            migrate(conn, first)


def test_a_failing_migration_applies_nothing(tmp_path: Path) -> None:
    good = [(1, "CREATE TABLE a (x);")]
    bad = [*good, (2, "CREATE TABLE b (y);"), (3, "CREATE TABLE c (z); THIS IS NOT SQL;")]
    with closing(sqlite3.connect(tmp_path / "m.db", isolation_level=None)) as conn:
        migrate(conn, good)
        with pytest.raises(sqlite3.OperationalError):
            migrate(conn, bad)
        assert not conn.in_transaction
        assert [r[0] for r in conn.execute("SELECT version FROM schema_version")] == [1]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert names == {"a", "schema_version"}


def test_migrations_must_be_numbered_in_order() -> None:
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        for wrong in ([(2, "")], [(1, ""), (3, "")], [(2, ""), (1, "")]):
            with pytest.raises(ValueError, match="numbered"):
                migrate(conn, wrong)


def test_split_statements() -> None:
    sql = """
        CREATE TABLE t (x TEXT DEFAULT 'a;b');
        CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 'c;d'; END;
        ;
    """
    assert [s.split()[1] for s in split_statements(sql)] == ["TABLE", "TRIGGER"]
    with pytest.raises(ValueError, match="incomplete"):
        list(split_statements("CREATE TABLE t (x TEXT DEFAULT 'unterminated;"))
    for _, migration in MIGRATIONS:
        assert list(split_statements(migration))


def test_switching_to_wal_waits_out_a_busy_answer_given_at_once(tmp_path: Path) -> None:
    """SQLite answers BUSY without waiting to a fresh-file opener that could deadlock.

    A connection with no busy timeout gets the same immediate answer while another holds the
    file: the switch to WAL tries again until the other lets go (4 processes opening a fresh
    file at once failed this way once in CI: "database is locked" at the journal-mode pragma).
    """
    path = tmp_path / "s.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    opener = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _wal(opener, within_s=0)  # no time to wait: the BUSY answer is the error
        release = threading.Timer(0.2, holder.execute, ("COMMIT",))
        release.start()
        started = time.monotonic()
        assert _wal(opener, within_s=5).lower() == "wal"
        assert 0.15 < time.monotonic() - started < 5
        release.join()
    finally:
        opener.close()
        holder.close()
