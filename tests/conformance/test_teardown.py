"""Teardown is cancellation-safe: cancelling a kill at any point leaks nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine
from typing import Any

import psutil

from sunroom import AsyncKernel, Limits

LIMITS = Limits(timeout_s=20)


async def _cancel_after(coro_task: asyncio.Task[None], ticks: int) -> None:
    for _ in range(ticks):
        await asyncio.sleep(0)
    coro_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await coro_task


TICKS = (0, 1, 2, 3, 5, 8, 13, 40)


async def _cancelled_teardown_leaks_nothing(
    backend: str, ticks: int, teardown: Callable[[AsyncKernel], Coroutine[Any, Any, None]]
) -> None:
    """Cancel *teardown* after *ticks*, call it again, then check nothing of the kernel is left."""
    k = AsyncKernel(backend=backend, limits=LIMITS)
    await k.start()
    proc = k.process
    assert proc is not None
    top = psutil.Process(proc.pid)  # type: ignore[attr-defined]
    tree = [top, *top.children(recursive=True)]
    rundir = getattr(proc, "rundir", None)
    task = asyncio.get_running_loop().create_task(teardown(k))
    await _cancel_after(task, ticks)
    await teardown(k)  # must finish the teardown the cancelled call began, not return early
    _, alive = await asyncio.to_thread(psutil.wait_procs, tree, timeout=5)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == [], ticks
    if rundir is not None:
        assert not await asyncio.to_thread(os.path.exists, rundir), ticks
    await k.aclose()


async def _kill(k: AsyncKernel) -> None:
    assert k.process is not None
    await k.process.kill()


async def _aclose(k: AsyncKernel) -> None:
    await k.aclose()


async def test_cancelling_a_kill_at_any_point_still_tears_everything_down(backend: str) -> None:
    """For every number of scheduler ticks, cancel ``kill()``; a repeated kill then finishes."""
    for ticks in TICKS:
        await _cancelled_teardown_leaks_nothing(backend, ticks, _kill)


async def test_cancelling_aclose_at_any_point_still_tears_everything_down(backend: str) -> None:
    """``AsyncKernel.aclose()`` cancelled after any number of ticks leaks nothing."""
    for ticks in TICKS:
        await _cancelled_teardown_leaks_nothing(backend, ticks, _aclose)
