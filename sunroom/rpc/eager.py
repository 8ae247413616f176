"""Starting a coroutine eagerly: its first step runs now, a task takes over at its first wait.

Python 3.12 has eager tasks; 3.11 does not. A coroutine that completes without waiting (a host
function answered from a dict, a validation error) then costs no task and no extra turn of the
event loop, which on a 2-core VM is ~5 us per turn and ~15 us per task (measured).

The first step runs outside any task, so code that needs one (``asyncio.timeout``,
``asyncio.current_task``, ``TaskGroup``) must first ``await in_task()``: outside a task that
ends the eager step, and the task that carries the coroutine on resumes it at once (in its own
first step); inside a task it does nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Awaitable, Coroutine, Generator
from typing import Final, final


def start_eagerly(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[object, object, None]
) -> asyncio.Task[None] | None:
    """Run *coro*'s first step now, in a copy of the current context; call on *loop*'s thread.

    Returns None when *coro* finished in that step (its result is dropped: it should handle its
    own outcome), else the task that carries it on, in the same context. An exception from the
    first step propagates to the caller.
    """
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    return loop.create_task(_CarryOn(coro, waiting_on), context=context)


class _InTask:
    """The marker :func:`in_task` yields when it runs outside a task (in an eager step)."""

    __slots__ = ()


_IN_TASK: Final = _InTask()
_STARTED: Final = object()  # _CarryOn has handed over what the eager step waited on


@final
class _CarryOn(Coroutine[object, object, None]):
    """What a task runs to go on with *serving*, started eagerly and now waiting on something.

    A coroutine object written out (not an ``async def``), so that a task cancelled before its
    first step still throws into *serving*: an ``async def`` wrapper would never start.

    *waiting_on* is what *serving* yielded at the end of its eager step: the task's first step
    gets it back, to wait on it, or, for :func:`in_task`'s marker, resumes *serving* at once.
    From then on every send and throw goes straight to *serving*, the first one included (a
    task cancelled before its first step throws into the handler, as it would into a
    coroutine it had started itself).
    """

    __slots__ = ("_serving", "_waiting_on")

    def __init__(self, serving: Coroutine[object, object, None], waiting_on: object) -> None:
        self._serving = serving
        self._waiting_on = waiting_on

    def send(self, value: object) -> object:
        waiting_on = self._waiting_on
        if waiting_on is _STARTED:
            return self._serving.send(value)
        self._waiting_on = _STARTED
        if waiting_on is _IN_TASK or waiting_on is None:  # None: a bare yield (sleep(0))
            return self._serving.send(None)
        return waiting_on  # the task waits on it, then sends its outcome to *serving*

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        val: object = None,
        tb: types.TracebackType | None = None,
    ) -> object:
        self._waiting_on = _STARTED
        if val is None and tb is None:
            return self._serving.throw(typ)
        if isinstance(typ, type):
            return self._serving.throw(typ, val, tb)
        if val is not None:  # what the coroutine's own throw says
            raise TypeError("instance exception may not have a separate value")
        return self._serving.throw(typ, None, tb)

    def close(self) -> None:
        self._serving.close()

    def __await__(self) -> Generator[object, object, None]:
        raise TypeError("a task runs this; it is not awaited")


class _EnterTask:
    __slots__ = ()

    def __await__(self) -> Generator[_InTask, object, None]:
        if asyncio.current_task() is None:
            yield _IN_TASK


def in_task() -> Awaitable[None]:
    """Await it before code that needs a task: an eager handler goes on inside one from there.

    Inside a task it does nothing (and costs no loop iteration). In an eager first step (see
    :func:`start_eagerly`) it ends that step; the task that carries the coroutine on resumes
    it at once, in the task's own first step.
    """
    return _ENTER_TASK


_ENTER_TASK: Final = _EnterTask()
