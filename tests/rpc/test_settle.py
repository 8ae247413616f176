"""settle(): a task one ended is awaited for its end, and one's own cancellation still propagates."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sunroom.rpc.settle import settle


async def test_the_end_of_a_cancelled_or_failed_task_is_returned_not_raised() -> None:
    sleeper = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    sleeper.cancel()
    assert isinstance(await settle(sleeper), asyncio.CancelledError)

    async def fail() -> None:
        raise ValueError("gone")

    assert isinstance(await settle(asyncio.create_task(fail())), ValueError)
    assert await settle(asyncio.create_task(asyncio.sleep(0))) is None


async def test_a_cancel_of_the_waiting_task_propagates_even_when_the_awaited_task_absorbs_it() -> (
    None
):
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    child = asyncio.create_task(stubborn())
    waiter = asyncio.create_task(settle(child))
    await asyncio.sleep(0.01)
    waiter.cancel()  # asyncio passes it on to child, which absorbs it
    await asyncio.sleep(0.01)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert child.done() and not child.cancelled()


async def test_a_timeout_around_settle_is_a_timeout() -> None:
    child = asyncio.create_task(asyncio.sleep(10))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await settle(asyncio.shield(child))
    child.cancel()
    assert isinstance(await settle(child), asyncio.CancelledError)


async def test_cleanup_after_a_cancel_still_settles_every_task() -> None:
    """In a ``finally`` after the caller's cancel, a child's own cancellation is not re-raised."""
    children = [asyncio.create_task(asyncio.sleep(10)) for _ in range(3)]
    ended: list[BaseException | None] = []

    async def owner() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            for child in children:
                child.cancel()
            for child in children:
                ended.append(await settle(child))

    task = asyncio.create_task(owner())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(ended) == 3 and all(isinstance(e, asyncio.CancelledError) for e in ended)
