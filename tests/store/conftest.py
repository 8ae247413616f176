"""Fixtures for the store suite: a fake clock and store handles over one storage.

The tests are written against the ``EventStore`` protocol and run on every backend of
``BACKENDS``: ``sqlite`` (a file in the test's tmp_path) and ``postgres`` (a fresh database of
the worker's scratch cluster, ``postgres_db_dsn``; those cases are ``kernel`` tests, as they
start a server). Tests of one backend itself live in ``test_sqlite.py``, ``test_postgres.py``
and ``test_processes.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sunroom.store import EventStore, NewEvent, SQLiteStore

BACKENDS = ("sqlite", "postgres")
T0 = 1_700_000_000.0


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


OpenStore = Callable[..., EventStore]
"""``open_store(clock=...)``: a new, unopened handle on the test's storage (use ``async with``)."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(
    params=[
        pytest.param(b, marks=[pytest.mark.kernel] if b == "postgres" else []) for b in BACKENDS
    ]
)
def open_store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> OpenStore:
    dsn = request.getfixturevalue("postgres_db_dsn") if request.param == "postgres" else ""

    def factory(*, clock: Callable[[], float] = clock) -> EventStore:
        if request.param == "sqlite":
            return SQLiteStore(tmp_path / "store.db", clock=clock)
        if request.param == "postgres":
            from sunroom.store.postgres import PostgresStore  # psycopg only when asked for

            return PostgresStore(dsn, clock=clock)
        raise AssertionError(request.param)  # pragma: no cover

    return factory


@pytest.fixture
async def store(open_store: OpenStore) -> AsyncIterator[EventStore]:
    async with open_store() as s:
        yield s


def batch(first: int, n: int, *, kind: str = "text", **payload: Any) -> list[NewEvent]:
    """Events ``first .. first + n - 1`` with a payload naming their seq."""
    return [
        NewEvent(seq=seq, kind=kind, payload={"n": seq, **payload}, ts=T0 + seq)
        for seq in range(first, first + n)
    ]
