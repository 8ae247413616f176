"""The egress thread (sunroom.network.egress_thread): where every kernel's proxy runs.

Work is awaited from the caller's loop, callbacks come back to it in order, a closed caller's
loop drops them, and a forked host process gets a thread of its own.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable

import pytest

from sunroom.network.egress_thread import egress_loop, on_caller, on_egress


async def test_work_runs_on_the_egress_thread_and_callbacks_come_back_in_order() -> None:
    caller = threading.get_ident()
    seen: list[tuple[int, int]] = []
    back = on_caller(lambda i: seen.append((i, threading.get_ident())))

    async def there() -> int:
        for i in range(100):
            back(i)
        return threading.get_ident()

    egress = await on_egress(there())
    assert egress != caller
    await asyncio.sleep(0)  # the callbacks were queued before the result: they have run
    assert seen == [(i, caller) for i in range(100)]
    assert type(egress_loop()).__module__.startswith("uvloop")  # a Linux dependency


async def test_cancelling_the_wait_cancels_the_work() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waiting = asyncio.ensure_future(on_egress(forever()))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await asyncio.to_thread(cancelled.wait, 5)


def test_a_callback_for_a_closed_loop_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    back = loop.run_until_complete(_make_callback())
    loop.close()
    back("late")  # no exception: nobody is left to receive it


async def _make_callback() -> Callable[..., None]:
    return on_caller(print)


def test_a_forked_process_gets_its_own_egress_thread() -> None:
    egress_loop()  # the parent's thread exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread did not survive the fork
        try:
            ok = asyncio.run(on_egress(asyncio.sleep(0, result=42))) == 42
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
