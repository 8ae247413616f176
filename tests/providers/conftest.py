from __future__ import annotations

from collections.abc import Iterator

import pytest

from sunroom.providers import Clock

from .replay import ReplayServer


class FakeTime:
    """Virtual time for retries and breakers: sleeping advances it instantly."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []
        self.draw = 0.5

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds

    def random(self) -> float:
        return self.draw

    @property
    def clock(self) -> Clock:
        return Clock(now=self.now, sleep=self.sleep, random=self.random)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as srv:
        yield srv
    assert not srv.unexpected, [f"{r.method} {r.path}" for r in srv.unexpected]


async def collect(stream: object, into: list[object] | None = None) -> list[object]:
    """Drain a model stream into a list of events (``into`` keeps them if it raises)."""
    events: list[object] = [] if into is None else into
    async for event in stream:  # type: ignore[attr-defined]
        events.append(event)
    return events
