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

__all__ = ["CURRENT_CLOCK", "CellClock", "CellLost", "cell_clock_paused"]


class CellLost(Exception):
    """The cell ignored its interrupt past the grace: the kernel must be killed."""


@final
class CellClock:
    """Times one cell without a task or a waiter: SIGINT at *timeout*, then gives up.

    At *timeout* the kernel is interrupted (:attr:`interrupted`); if *call* is still not
    answered *grace* seconds later, it fails with :class:`CellLost`. A late answer is then
    dropped by the channel. :meth:`pause` / :meth:`resume` (counted: the clock runs again
    after the last resume) stop the clock and keep the time left of the current phase.
    """

    __slots__ = (
        "_call",
        "_grace",
        "_left",
        "_loop",
        "_pauses",
        "_phase",
        "_proc",
        "_stopped",
        "_timer",
        "interrupted",
    )

    def __init__(
        self, call: asyncio.Future[Any], proc: KernelProcess, timeout: float, grace: float
    ) -> None:
        self._call = call
        self._proc = proc
        self._grace = grace
        self._loop = call.get_loop()
        self.interrupted = False
        self._pauses = 0
        self._left = 0.0
        self._stopped = False
        self._phase: Callable[[], None] = self._interrupt
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(timeout, self._interrupt)

    def _interrupt(self) -> None:
        self._timer = None
        if self._call.done():
            return
        self.interrupted = True
        try:
            self._proc.interrupt()
        except Exception as exc:  # the caller gets it, as when it sent the signal itself
            self._call.set_exception(exc)
            return
        self._phase = self._give_up
        self._timer = self._loop.call_later(self._grace, self._give_up)

    def _give_up(self) -> None:
        self._timer = None
        if not self._call.done():
            self._call.set_exception(CellLost())

    def pause(self) -> None:
        """Stop the clock (nested pauses are counted); the time left is kept."""
        self._pauses += 1
        if self._pauses == 1 and self._timer is not None:
            self._left = max(0.0, self._timer.when() - self._loop.time())
            self._timer.cancel()
            self._timer = None

    def resume(self) -> None:
        """End one pause; after the last one the clock runs on with the time that was left."""
        if self._pauses == 0:
            return
        self._pauses -= 1
        if self._pauses == 0 and not self._stopped and not self._call.done():
            self._timer = self._loop.call_later(self._left, self._phase)

    def stop(self) -> None:
        """Stop for good (the cell is over)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


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
