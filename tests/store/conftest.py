"""Fixtures for the store suite: a fake clock and store handles over one storage.

The tests are written against the ``EventStore`` protocol: to run them against another
backend, add it to ``BACKENDS`` and teach ``open_store`` to build it. Tests that need SQLite
itself (files, processes, migrations) live in ``test_sqlite.py`` and ``test_processes.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sunroom.store import EventStore, NewEvent, SQLiteStore

BACKENDS = ("sqlite",)
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


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> OpenStore:
    def factory(*, clock: Callable[[], float] = clock) -> EventStore:
        if request.param == "sqlite":
            return SQLiteStore(tmp_path / "store.db", clock=clock)
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
