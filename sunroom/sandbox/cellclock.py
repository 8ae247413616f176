"""The timeout clock of one cell: :class:`CellClock`, and :func:`cell_clock_paused`.

A cell's timeout is enforced on the host, not in the kernel: the clock interrupts the kernel
(SIGINT) when the cell's time is up and gives up on it after a grace. While a host call waits
for something that is not the cell's own work (a person approving it), the clock of the cell
that made the call can be paused: :func:`cell_clock_paused` stops it, and the time left is
kept and runs on when the last pause ends. The kernel protocol is not involved (the kernel
side has no clock of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, final

from sunroom.sandbox.backend import KernelProcess

__all__ = ["CURRENT_CLOCK", "Alarm", "CellClock", "CellLost", "cell_clock_paused"]


class CellLost(Exception):
    """The cell ignored its interrupt past the grace: the kernel must be killed."""


@final
class Alarm:
    """One callback at a time, due at a loop time, on a timer handle kept from one to the next.

    The clocks of a kernel's successive cells share one: a quick cell's deadline lies after the
    handle set for an earlier cell, so the handle stays, and when it fires before the deadline
    now set it is set again for that deadline. A cell then costs no timer handle of its own to
    schedule and cancel (and no cancelled handle left in the loop's heap): about a tenth of the
    host's work per ``execute``. A deadline earlier than the handle's replaces the handle.
    """

    __slots__ = ("_callback", "_deadline", "_handle", "_when", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._when = 0.0  # the loop time the handle fires at
        self._deadline = 0.0
        self._callback: Callable[[], None] | None = None

    def set(self, delay: float, callback: Callable[[], None]) -> None:
        """Call *callback* in *delay* seconds, in place of any callback set before."""
        deadline = self.loop.time() + delay
        self._deadline, self._callback = deadline, callback
        if self._handle is None or self._when > deadline:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self.loop.call_at(deadline, self._fire)
            self._when = deadline

    def left(self) -> float:
        """Seconds until the callback set is due (0 when it is overdue or none is set)."""
        if self._callback is None:
            return 0.0
        return max(0.0, self._deadline - self.loop.time())

    def clear(self) -> None:
        """Call nothing (the handle stays, for the next :meth:`set`)."""
        self._callback = None

    def close(self) -> None:
        """Call nothing and cancel the handle (the kernel is gone)."""
        self._callback = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        callback = self._callback
        if callback is None:
            return
        if self._deadline > self._when:  # set for a later cell: wait on until its deadline
            self._handle = self.loop.call_at(self._deadline, self._fire)
            self._when = self._deadline
            return
        self._callback = None
        callback()


@final
class CellClock:
    """Times one cell without a task or a waiter: SIGINT at *timeout*, then gives up.

    At *timeout* the kernel is interrupted (:attr:`interrupted`); if *call* is still not
    answered *grace* seconds later, it fails with :class:`CellLost`. A late answer is then
    dropped by the channel. :meth:`pause` / :meth:`resume` (counted: the clock runs again
    after the last resume) stop the clock and keep the time left of the current phase.
    *alarm* (on *call*'s loop) times it: the kernel's, shared by its cells one after another;
    by default one of its own.
    """

    __slots__ = (
        "_alarm",
        "_call",
        "_grace",
        "_left",
        "_pauses",
        "_phase",
        "_proc",
        "_running",
        "_stopped",
        "interrupted",
    )

    def __init__(
        self,
        call: asyncio.Future[Any],
        proc: KernelProcess,
        timeout: float,
        grace: float,
        *,
        alarm: Alarm | None = None,
    ) -> None:
        self._call = call
        self._proc = proc
        self._grace = grace
        self._alarm = Alarm(call.get_loop()) if alarm is None else alarm
        self.interrupted = False
        self._pauses = 0
        self._left = 0.0
        self._phase: Callable[[], None] = self._interrupt
        self._stopped = False
        self._running = True  # the alarm is set for this clock's phase
        self._alarm.set(timeout, self._interrupt)

    def _interrupt(self) -> None:
        self._running = False
        if self._call.done():
            return
        self.interrupted = True
        try:
            self._proc.interrupt()
        except Exception as exc:  # the caller gets it, as when it sent the signal itself
            self._call.set_exception(exc)
            return
        self._phase = self._give_up
        self._running = True
        self._alarm.set(self._grace, self._give_up)

    def _give_up(self) -> None:
        self._running = False
        if not self._call.done():
            self._call.set_exception(CellLost())

    def pause(self) -> None:
        """Stop the clock (nested pauses are counted); the time left is kept."""
        self._pauses += 1
        if self._pauses == 1 and self._running:
            self._left = self._alarm.left()
            self._alarm.clear()
            self._running = False

    def resume(self) -> None:
        """End one pause; after the last one the clock runs on with the time that was left."""
        if self._pauses == 0:
            return
        self._pauses -= 1
        if self._pauses == 0 and not self._stopped and not self._call.done():
            self._running = True
            self._alarm.set(self._left, self._phase)

    def stop(self) -> None:
        """Stop for good (the cell is over)."""
        self._stopped = True
        if self._running:
            self._running = False
            self._alarm.clear()


CURRENT_CLOCK: contextvars.ContextVar[CellClock | None] = contextvars.ContextVar(
    "sunroom_cell_clock", default=None
)
"""The clock of the cell whose host call is being served (set by the kernel per request)."""


@contextlib.contextmanager
def cell_clock_paused() -> Iterator[None]:
    """While inside, the timeout of the cell that made the current host call does not run.

    Outside a host call (or when no cell is running) it does nothing. The time spent inside
    is not counted against the cell's timeout; the kernel's own wall clock (``duration_s``)
    still counts it.
    """
    clock = CURRENT_CLOCK.get()
    if clock is None:
        yield
        return
    clock.pause()
    try:
        yield
    finally:
        clock.resume()
