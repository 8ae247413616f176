"""A private event loop on a background thread, for the thin sync shells.

The sync classes (``sunroom.Kernel``) run their async core on a :class:`Portal`, so they work
from plain scripts and from inside code that already runs an event loop (notebooks).

A call costs one hand-off each way and little more: the caller schedules the coroutine on the
loop (one ``call_soon_threadsafe``) and sleeps on a plain lock, which the coroutine's task
releases as its last step. (``run_coroutine_threadsafe`` chains a ``concurrent.futures.Future``
through a done callback, a condition variable and one more turn of the loop: ~60 us per call on
a 2-core VM, against ~36 us for this and ~20 us for an eager call.)
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar, final

from sunroom.errors import ClosedError
from sunroom.rpc.eager import start_eagerly

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
class _Call:
    """One coroutine run for a caller on another thread, and its outcome."""

    __slots__ = ("coro", "done", "error", "finished", "task", "value")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.done = threading.Lock()
        self.done.acquire()  # released once, by the loop thread, when the outcome is in
        self.finished = False
        self.task: asyncio.Task[None] | None = None  # a reference: the loop keeps weak ones
        self.value: Any = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        """Wake the caller (loop thread only; once)."""
        if not self.finished:
            self.finished = True
            self.done.release()


@final
class Portal:
    """Runs coroutines on a dedicated loop thread; ``close()`` stops the thread.

    After ``close()``, :meth:`call` raises ClosedError naming *what* (e.g. "the kernel").
    """

    def __init__(self, name: str = "sunroom-portal", *, what: str = "the portal") -> None:
        self._what = what
        self._calls: set[_Call] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_forever()
        finally:
            self._abandon_calls()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _abandon_calls(self) -> None:
        """Wake every caller still waiting when the loop stops: they get ClosedError."""
        for call in list(self._calls):
            if not call.finished:
                call.error = ClosedError(f"{self._what} was closed during the call")
                call.finish()
        self._calls.clear()

    def call(self, coro: Coroutine[Any, Any, T], *, eager: bool = False) -> T:
        """Run *coro* on the loop and block until it finishes; re-raises its exception.

        *eager*: run its first step as soon as the loop thread takes the call, before any task
        exists (:func:`~sunroom.rpc.eager.start_eagerly`; saves a turn of the loop). Only for
        coroutines that await :func:`~sunroom.rpc.eager.in_task` before anything that needs a
        task.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("Portal.call from the portal's own thread would deadlock")
        if self.closed:
            coro.close()
            raise ClosedError(f"{self._what} is closed")
        call = _Call(coro)
        try:
            self._loop.call_soon_threadsafe(self._begin, call, eager)
        except RuntimeError:  # the loop closed meanwhile
            coro.close()
            raise ClosedError(f"{self._what} is closed") from None
        call.done.acquire()
        if call.error is not None:
            error, call.error = call.error, None  # no cycle through the traceback
            raise error
        result: T = call.value
        return result

    def _begin(self, call: _Call, eager: bool) -> None:
        self._calls.add(call)
        if eager:
            call.task = start_eagerly(self._loop, self._run_call(call))
        else:
            call.task = self._loop.create_task(self._run_call(call))

    async def _run_call(self, call: _Call) -> None:
        try:
            call.value = await call.coro
        except BaseException as exc:  # noqa: BLE001 - the caller re-raises it
            call.error = exc
        finally:
            self._calls.discard(call)
            call.task = None
            call.finish()

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
