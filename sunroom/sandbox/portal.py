"""A private event loop on a background thread, for the thin sync shells.

The sync classes (``sunroom.Kernel``) run their async core on a :class:`Portal`, so they work
from plain scripts and from inside code that already runs an event loop (notebooks).
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar, final

from sunroom.errors import ClosedError

T = TypeVar("T")


class TwinState(enum.Enum):
    """The lifecycle of a sync twin: built, then started (opened), then closed for good.

    Like httpx's client state: a closed twin refuses every call with ClosedError and closing it
    again does nothing.
    """

    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


@final
class Portal:
    """Runs coroutines on a dedicated loop thread; ``close()`` stops the thread.

    After ``close()``, :meth:`call` raises ClosedError naming *what* (e.g. "the kernel").
    """

    def __init__(self, name: str = "sunroom-portal", *, what: str = "the portal") -> None:
        self._what = what
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run *coro* on the loop and block until it finishes; re-raises its exception."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("Portal.call from the portal's own thread would deadlock")
        if self.closed:
            coro.close()
            raise ClosedError(f"{self._what} is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call_soon(self, fn: Any, *args: Any) -> None:
        """Schedule a plain callable on the loop thread (a no-op once closed)."""
        if not self.closed:
            self._loop.call_soon_threadsafe(fn, *args)

    @property
    def closed(self) -> bool:
        """Whether the loop thread has been stopped."""
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop the loop and join the thread (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
