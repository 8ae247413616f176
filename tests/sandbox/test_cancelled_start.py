"""A kernel start cancelled at any point leaks nothing: no socket, no process.

A session's kernel now starts in the background and is cancelled when the session is deleted
or released while it starts (sunroom/service/sessions.py): every step of a launch must give back
what it took when cancelled, sockets included (an unclosed socket is a ResourceWarning, an
error under the suite's warning filter).
"""

from __future__ import annotations

import asyncio
import gc

import psutil

from sunroom import AsyncKernel


async def test_a_start_cancelled_at_any_point_leaks_no_socket_or_process() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    for delay_ms in (0, 1, 2, 3, 5, 8, 12, 20, 30, 50, 80):
        kernel = AsyncKernel(backend="subprocess")
        starting = asyncio.ensure_future(kernel.start())
        await asyncio.sleep(delay_ms / 1000)
        starting.cancel()
        await asyncio.wait([starting])
        await kernel.aclose()
        gc.collect()  # an unclosed socket would warn here, failing the test
    for _ in range(200):
        left = {p.pid for p in psutil.Process().children(recursive=True)} - before
        live = [pid for pid in left if psutil.pid_exists(pid)]
        if not live:
            break
        await asyncio.sleep(0.05)
    assert not live, live
