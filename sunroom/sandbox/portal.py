"""A private event loop for the thin sync shells, run by whichever thread needs it.

The sync classes (``sunroom.Kernel``, ``sunroom.Session``) run their async core on a
:class:`Portal`, so they work from plain scripts and from inside code that already runs an event
loop (notebooks).

Who runs the loop:

* **The caller, in the common case.** A caller whose thread runs no event loop of its own drives
  the portal's loop itself, on its own thread, until its coroutine is done; then it returns. No
  thread hand-off on the way in or out: a sync call costs what the async one does plus a few
  microseconds. (Handing each call to a loop thread and waking the caller again cost two thread
  wake-ups, ~60 us per call on a 2-core VM, against ~140 us for a whole async execute.)
* **A watcher thread, between calls.** It sleeps in ``poll()`` on the loop's selector (epoll) fd
  until an fd is ready or the loop's next timer is due, and then, if no caller drives, runs the
  loop until it would wait again. So background work goes on between calls as on a loop thread
  of its own: a host call from a thread the cell left running, output, a session started in the
  background, callbacks scheduled from other threads (``call_soon``).
* **Whoever drives, for a hand-off.** A caller inside a running loop (a notebook cell), or one
  that arrives while another caller drives, hands its coroutine to the loop with
  ``call_soon_threadsafe`` and sleeps on a plain lock that the coroutine's task releases.

Ctrl-C while the main thread drives ends the drive between two steps of the loop (never in the
middle of one) and raises KeyboardInterrupt in the caller; the coroutine goes on in the
background, as it would on a loop thread.
"""

from __future__ import annotations

import asyncio
import enum
import importlib
import math
import select
import selectors
import signal
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar, final

from sunroom.errors import ClosedError
from sunroom.rpc.eager import start_eagerly

T = TypeVar("T")

# How often the watcher looks whether a caller's drive has ended (it is not told: see _drive).
# Background work waits at most this long when it comes just after a call.
_GLANCE_S = 0.005

# ``signal.signal`` and ``signal.getsignal`` wrap the C functions of ``_signal`` to convert enums,
# at ~5 us a call; a Ctrl-C trap is set and reset on every call of the main thread, so call the
# C ones (0.5 us).
_c_signal = importlib.import_module("_signal")
_set_handler: Callable[[int, Any], Any] = _c_signal.signal
_get_handler: Callable[[int], Any] = _c_signal.getsignal


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
    """One coroutine run for a caller, and its outcome."""

    __slots__ = ("coro", "done", "error", "finished", "task", "value")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.done = threading.Lock()
        self.done.acquire()  # released once, by the loop, when the outcome is in
        self.finished = False
        self.task: asyncio.Task[None] | None = None  # a reference: the loop keeps weak ones
        self.value: Any = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        """Record that the outcome is in and wake a caller sleeping on it (on the loop; once)."""
        if not self.finished:
            self.finished = True
            self.done.release()

    def outcome(self) -> Any:
        """The coroutine's value, or raise its exception."""
        if self.error is not None:
            error, self.error = self.error, None  # no cycle through the traceback
            raise error
        return self.value


def _nothing() -> None:
    """Scheduled only to wake whoever waits on the loop's selector."""


@final
class _Selector(selectors.DefaultSelector):
    """The portal loop's selector: where a drive ends, at a moment the loop is between steps.

    ``until`` (a caller's drive) ends the drive at the first wait once it returns True.
    ``to_idle`` (the watcher's drive) ends it once nothing is ready and no fd has an event, or
    at once when a caller asks for the loop (``yield_soon``). ``idle_for`` then holds how long the
    loop meant to wait (None: until an fd is ready, 0: work is ready now).
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.until: Callable[[], bool] | None = None
        self.to_idle = False
        self.yield_soon = False
        self.idle_for: float | None = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        until = self.until
        if until is not None and until():
            return self._end(timeout)
        if self.to_idle:
            if self.yield_soon:
                return self._end(0.0)
            events = super().select(0)
            if events or timeout == 0:
                return events
            return self._end(timeout)
        return super().select(timeout)

    def _end(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        self.until = None
        self.to_idle = False
        self.idle_for = timeout
        self.loop.stop()  # the loop finishes this step (timers due, callbacks ready) and returns
        return []


@final
class Portal:
    """Runs coroutines on a private event loop for sync callers; ``close()`` ends it.

    After ``close()``, :meth:`call` raises ClosedError naming *what* (e.g. "the kernel").
    """

    def __init__(self, name: str = "sunroom-portal", *, what: str = "the portal") -> None:
        self._what = what
        self._calls: set[_Call] = set()
        self._selector = _Selector()
        self._loop = asyncio.SelectorEventLoop(self._selector)
        self._selector.loop = self._loop
        self._state = threading.Condition()  # guards the fields below
        self._owner: threading.Thread | None = None  # the thread that drives the loop now
        self._closing = False
        self._deadline: float | None = None  # (loop time) the loop's next timer; None: none
        self._watching = False  # the watcher sleeps in poll() ...
        self._watch_until: float | None = None  # ... until this (None: until an fd is ready)
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    # -- calls ------------------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T], *, eager: bool = False) -> T:
        """Run *coro* on the loop and block until it finishes; re-raises its exception.

        *eager*: run its first step as soon as the loop takes the call, before any task exists
        (:func:`~sunroom.rpc.eager.start_eagerly`; saves a turn of the loop). Only for
        coroutines that await :func:`~sunroom.rpc.eager.in_task` before anything that needs a
        task. Raises ClosedError once the portal is closing or closed, RuntimeError when called
        from the portal's own loop (it would wait on itself for ever).
        """
        running = asyncio.events._get_running_loop()
        if running is self._loop:
            coro.close()
            raise RuntimeError("Portal.call from the portal's own loop would deadlock")
        me = threading.current_thread()
        with self._state:
            if running is None:
                while self._owner is self._thread and not self._closing:
                    self._selector.yield_soon = True  # the watcher's drive ends at its next step
                    self._state.wait()
                self._selector.yield_soon = False
            if self._closing:
                coro.close()
                raise ClosedError(f"{self._what} is closed")
            drive = running is None and self._owner is None
            if drive:
                self._owner = me
            else:  # hand off; under the lock, so the loop cannot have closed meanwhile
                call = _Call(coro)
                self._loop.call_soon_threadsafe(self._begin, call, eager)
        if drive:
            result: T = self._drive_call(coro, eager)
            return result
        call.done.acquire()
        handed: T = call.outcome()
        return handed

    def _drive_call(self, coro: Coroutine[Any, Any, Any], eager: bool) -> Any:
        """Run the loop on this thread until *coro* is done (the caller owns the loop)."""
        call = _Call(coro)
        interrupted: list[int] = []
        previous = _trap_sigint(interrupted, self._loop)
        try:
            asyncio.events._set_running_loop(self._loop)  # the first step runs here and now
            try:
                self._begin(call, eager)
            finally:
                asyncio.events._set_running_loop(None)
            # (even when the call is done: the loop is given up at the end of a drive)
            self._drive(until=lambda: call.finished or self._closing or bool(interrupted))
        finally:
            if previous is not None:
                _set_handler(signal.SIGINT, previous)
        if not call.finished:  # it goes on in the background, or ends with the loop
            if interrupted:
                raise KeyboardInterrupt
            raise ClosedError(f"{self._what} was closed during the call")
        return call.outcome()

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

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Schedule a plain callable on the loop, from any thread (a no-op once closing)."""
        with self._state:
            if not self._closing:
                self._loop.call_soon_threadsafe(fn, *args)

    # -- who drives -------------------------------------------------------------------------

    def _drive(self, *, until: Callable[[], bool] | None = None) -> None:
        """Run the loop on this thread (its owner) until *until* holds, or else until idle.

        Gives the loop up afterwards, telling the watcher when the loop's next timer is due.
        """
        selector = self._selector
        selector.idle_for = 0.0  # unless the drive ends at a wait: work may be left
        if until is not None:
            selector.until = until
        else:
            selector.to_idle = True
        try:
            self._loop.run_forever()
        finally:
            selector.until = None
            selector.to_idle = False
            wait = selector.idle_for
            deadline = None if wait is None else self._loop.time() + wait
            with self._state:
                self._owner = None
                self._deadline = deadline
                # who waits for this: callers (on the watcher's drives), the shutdown, and a
                # hand-off left pending. The watcher itself glances every _GLANCE_S instead:
                # waking it after every call cost ~20 us a call, in thread switches.
                if until is None or self._calls or self._closing:
                    self._state.notify_all()
                late = self._watching and deadline is not None
                if late and self._watch_until is not None:
                    late = deadline < self._watch_until
                if late:  # the watcher sleeps past this timer: wake it to sleep again
                    self._loop.call_soon_threadsafe(_nothing)

    def _watch(self) -> None:
        """The watcher thread: drive the loop whenever it has work and no caller drives it."""
        poller = select.poll()
        poller.register(self._selector.fileno(), select.POLLIN)
        me = threading.current_thread()
        try:
            while True:
                with self._state:
                    while self._owner is not None and not self._closing:
                        self._state.wait(_GLANCE_S)  # a caller's drive ends without a word
                    if self._closing:
                        return
                    self._watching, self._watch_until = True, self._deadline
                    timeout_ms = -1
                    if self._deadline is not None:
                        left = self._deadline - self._loop.time()
                        timeout_ms = max(0, math.ceil(left * 1000))
                poller.poll(timeout_ms)
                with self._state:
                    self._watching = False
                    if self._owner is not None or self._is_closing():
                        continue  # (when closing, the wait above returns)
                    self._owner = me
                self._drive()
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        """On the watcher, once closing: wake the callers left waiting and close the loop."""
        with self._state:
            while self._owner is not None:  # a driving caller stops at its next step
                self._state.wait()
            self._owner = threading.current_thread()
        for call in list(self._calls):
            if not call.finished:
                call.error = ClosedError(f"{self._what} was closed during the call")
                call.finish()
        self._calls.clear()
        try:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()
            with self._state:
                self._owner = None
                self._state.notify_all()

    def _is_closing(self) -> bool:
        return self._closing

    # -- life -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the portal has been closed for good (its loop is closed)."""
        return not self._thread.is_alive()

    def close(self) -> None:
        """End the loop: callers still waiting get ClosedError. Idempotent.

        Raises RuntimeError when called from the portal's own loop (it would wait on itself).
        """
        if asyncio.events._get_running_loop() is self._loop:
            raise RuntimeError("Portal.close from the portal's own loop would deadlock")
        with self._state:
            if not self._closing:
                self._closing = True
                self._state.notify_all()
                self._loop.call_soon_threadsafe(_nothing)  # wakes the watcher or a driver
        self._thread.join()


def _trap_sigint(interrupted: list[int], loop: asyncio.AbstractEventLoop) -> Any:
    """On the main thread with Python's default Ctrl-C handler, catch Ctrl-C between steps.

    Returns the handler to restore, or None when nothing was installed. A second Ctrl-C raises
    KeyboardInterrupt at once, wherever the loop is.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = _get_handler(signal.SIGINT)
    if previous is not signal.default_int_handler:
        return None

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(signum)
        loop.call_soon_threadsafe(_nothing)  # wakes the selector, where the drive ends

    _set_handler(signal.SIGINT, on_sigint)
    return previous
