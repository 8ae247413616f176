"""Waiting for a task one has ended, without swallowing one's own cancellation.

Closing code cancels its helper tasks and then awaits them, so that they are done before it
returns; how they ended (cancelled, failed) is not news to the code that ended them. But
``contextlib.suppress(BaseException)`` around that await also drops a cancellation of the
closing code's own task, arriving while it waits: its caller's ``cancel()`` or timeout is lost
and the caller carries on as if nothing happened. :func:`settle` drops only the helper's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def settle(awaitable: Awaitable[object]) -> BaseException | None:
    """Await *awaitable* (a task or future one has usually cancelled) until it is done.

    Returns how it ended: None when it returned, else the exception it raised (its own
    ``CancelledError`` included), which is not raised. Raises ``CancelledError`` when the
    current task was asked to cancel while it waited (its ``cancelling()`` count rose), even
    when the awaited task absorbed the cancel that asyncio passes on to it. ``KeyboardInterrupt``
    and ``SystemExit`` propagate.
    """
    current = asyncio.current_task()
    asked = current.cancelling() if current is not None else 0
    ended: BaseException | None = None
    try:
        await awaitable
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - reported, not raised
        ended = exc
    if current is not None and current.cancelling() > asked:
        if isinstance(ended, asyncio.CancelledError):
            raise ended
        raise asyncio.CancelledError
    return ended
