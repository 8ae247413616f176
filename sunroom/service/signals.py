"""Wake-ups for SSE readers: :class:`Signals`, one edge-triggered signal per session.

A reader takes a :meth:`~Signals.token` *before* it reads the store, then waits on it: an
append that lands between the read and the wait still wakes it, so nothing is missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import final

__all__ = ["Signals"]


@final
class Signals:
    """Per-session wake-ups (used from one event loop)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def token(self, sid: str) -> asyncio.Event:
        """The event the next :meth:`fire` for *sid* sets."""
        event = self._events.get(sid)
        if event is None:
            event = self._events[sid] = asyncio.Event()
        return event

    def fire(self, sid: str) -> None:
        """Wake everyone holding a token for *sid*."""
        event = self._events.pop(sid, None)
        if event is not None:
            event.set()

    def fire_all(self) -> None:
        """Wake every reader (anything may have changed: a follower reconnected)."""
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    @staticmethod
    async def wait(token: asyncio.Event, timeout_s: float) -> bool:
        """Wait until *token* is set or *timeout_s* passes; whether it was set."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(token.wait(), timeout_s)
        return token.is_set()
