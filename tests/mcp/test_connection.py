"""Connection's own lifecycle, without a server: what closing waits for, and what it lets through."""

from __future__ import annotations

import asyncio
import sys

import pytest

import sunroom
from sunroom.mcp.connection import Connection


async def test_a_cancel_of_aclose_while_the_old_connection_ends_propagates() -> None:
    """Closing waits up to 5 s for the connection's task; its caller's cancel is not absorbed."""
    conn = Connection(sunroom.mcp.stdio(sys.executable, ["-c", "pass"], name="slow"))
    stop = asyncio.Event()

    async def slow_to_stop() -> None:  # a server that takes its time to exit
        await stop.wait()
        await asyncio.sleep(2)

    holder = asyncio.create_task(slow_to_stop())
    conn._task, conn._stop = holder, stop
    closing = asyncio.create_task(conn.aclose())
    await asyncio.sleep(0.05)  # aclose has told the connection to stop and waits for it
    assert stop.is_set() and not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(closing, 1.0)
    await asyncio.sleep(0)
    assert holder.cancelled()  # not left running with nobody to wait for it
