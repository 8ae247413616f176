"""The egress thread (sunroom.network.egress_thread): where every kernel's proxy runs.

Work is awaited from the caller's loop, callbacks come back to it in order, a closed caller's
loop drops them, and a forked host process gets a thread of its own.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sunroom import Network
from sunroom.network.egress_thread import egress_loop, on_caller, on_egress
from sunroom.prelude import egress
from sunroom.sandbox.network import Egress


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


async def test_a_proxy_closes_fully_even_when_its_closer_is_cancelled(tmp_path: Path) -> None:
    net = Network(allow=["api.test"], hosts={"api.test": "127.0.0.1"})
    run = await Egress(network=net).open(tmp_path / "net", None)
    sock = tmp_path / "net" / "proxy.sock"
    with egress.listen(0) as listener:  # a kernel's listener, and a client half-way in a request
        await asyncio.to_thread(egress.hand_over, listener, str(sock))
        port = listener.getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET http://api.test/ HTTP/1.1\r\n")
    for _ in range(200):
        if run.proxy.connections:
            break
        await asyncio.sleep(0.01)
    assert run.proxy.connections == 1  # so the close has a connection to end, and must wait
    egress_loop().call_soon_threadsafe(time.sleep, 0.3)  # the egress loop is busy a while:
    closing = asyncio.ensure_future(run.aclose())  # the close is still waiting to start there
    await asyncio.sleep(0.05)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    for _ in range(200):  # the close goes on to its end on the egress thread
        if not sock.exists():
            break
        await asyncio.sleep(0.01)
    assert not sock.exists()
    writer.close()
    await run.aclose()  # idempotent
