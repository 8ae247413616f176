"""Fan-out of session events to many subscribers: :class:`EventBus`.

Publishing never blocks and never awaits. Each subscriber has its own bounded buffer: when it
is full, a *routine* event is dropped for that subscriber (and counted in ``dropped``), while a
*control* event (see :data:`~sunroom.agent.events.CONTROL_EVENTS`) is always kept, so a slow
subscriber sees every turn end, submit and run end, and never stalls the session.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable
from typing import final

from sunroom.agent.events import CONTROL_EVENTS, Event
from sunroom.errors import UsageError

__all__ = ["EventBus", "Subscription"]


@final
class Subscription:
    """One subscriber's view of the bus: an async iterator of events.

    It receives every event published after it was created. Iteration ends when the bus closes
    (the session was closed) or when :meth:`close` is called. ``dropped`` counts routine events
    lost because this subscriber fell ``maxsize`` events behind.
    """

    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self._maxsize = maxsize
        self._buffer: collections.deque[Event] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self.dropped = 0

    def _offer(self, event: Event) -> None:
        if self._closed:
            return
        if len(self._buffer) >= self._maxsize and not isinstance(event, CONTROL_EVENTS):
            self.dropped += 1
            return
        self._buffer.append(event)
        self._wakeup.set()

    def _end(self) -> None:
        self._closed = True
        self._wakeup.set()

    def close(self) -> None:
        """Stop receiving; a pending or later ``__anext__`` ends the iteration."""
        self._end()
        self._buffer.clear()
        self._bus._remove(self)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._buffer.popleft()

    def get_nowait(self) -> Event | None:
        """The next buffered event, or None when none is waiting."""
        return self._buffer.popleft() if self._buffer else None


@final
class EventBus:
    """Numbers events and hands them to every subscriber without blocking.

    Must be used from one event loop (the session's); publish from that loop only.
    """

    def __init__(self, *, maxsize: int = 1000) -> None:
        if maxsize <= 0:
            raise UsageError("the event buffer size must be positive")
        self._maxsize = maxsize
        self._subscribers: list[Subscription] = []
        self._seq = 0
        self._closed = False

    @property
    def seq(self) -> int:
        """The sequence number of the last published event (0 before any)."""
        return self._seq

    def subscribe(self, *, maxsize: int | None = None) -> Subscription:
        """A new subscription receiving every later event; on a closed bus it is already over."""
        sub = Subscription(self, maxsize or self._maxsize)
        if self._closed:
            sub._end()
        else:
            self._subscribers.append(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        if sub in self._subscribers:
            self._subscribers.remove(sub)

    def publish(self, cls: type[Event], **fields: object) -> Event:
        """Build an event of type *cls* with the next ``seq`` and the time, and fan it out."""
        self._seq += 1
        build: Callable[..., Event] = cls  # type: ignore[explicit-any]  # each event checks its fields
        event = build(seq=self._seq, ts=time.time(), **fields)
        for sub in self._subscribers:
            sub._offer(event)
        return event

    def close(self) -> None:
        """End every subscription (they drain what they hold, then stop). Idempotent."""
        self._closed = True
        for sub in self._subscribers:
            sub._end()
        self._subscribers.clear()
