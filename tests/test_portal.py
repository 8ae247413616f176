"""The Portal under the sync twins: who runs its loop, and that work goes on between calls.

A caller with no loop of its own drives the portal's loop on its own thread; between calls a
watcher thread drives it whenever an fd is ready or a timer is due. These tests pin the cases a
loop thread of its own used to cover for free: background host calls, timers and callbacks
between calls, hand-offs while another thread drives, Ctrl-C, and a busy background task.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from sunroom import Kernel
from sunroom.errors import ClosedError
from sunroom.sandbox.portal import Portal

FAST = "subprocess"


def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return check()


def test_the_caller_drives_the_loop_on_its_own_thread() -> None:
    portal = Portal()
    try:

        async def where() -> threading.Thread:
            await asyncio.sleep(0)
            return threading.current_thread()

        assert portal.call(where()) is threading.current_thread()
        assert portal.call(where(), eager=True) is threading.current_thread()
    finally:
        portal.close()


def test_a_host_call_from_a_thread_the_cell_left_running_is_served_between_calls() -> None:
    seen: list[int] = []

    async def note(x: int) -> int:
        seen.append(x)
        return x + 1

    with Kernel(backend=FAST, functions=[note]) as k:
        cell = (
            "import threading, time\n"
            "out = []\n"
            "def later():\n"
            "    time.sleep(0.2)\n"
            "    out.append(note(41))\n"
            "threading.Thread(target=later).start()\n"
        )
        assert k.execute(cell).status == "ok"
        # no call from here on: the watcher must serve the host call on its own
        assert _wait_for(lambda: seen == [41]), seen
        # the answer reaches the kernel's thread a moment after the host served the call
        assert _wait_for(lambda: k.execute("out").value == "[42]")


def test_timers_and_callbacks_fire_between_calls() -> None:
    portal = Portal()
    fired = threading.Event()
    soon = threading.Event()
    try:

        async def arm() -> None:
            asyncio.get_running_loop().call_later(0.1, fired.set)

        portal.call(arm())
        assert not fired.is_set()
        assert fired.wait(5), "a timer set during a call never fired after it"
        portal.call_soon(soon.set)  # from this thread, while nobody drives
        assert soon.wait(5), "call_soon between calls never ran"
    finally:
        portal.close()


def test_a_second_thread_hands_off_to_the_driving_caller() -> None:
    portal = Portal()
    driving = threading.Event()
    try:

        async def slow() -> str:
            driving.set()
            await asyncio.sleep(1.0)
            return "slow"

        async def quick() -> str:
            await asyncio.sleep(0)
            return "quick"

        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(portal.call(slow())))
        t.start()
        assert driving.wait(5)
        started = time.monotonic()
        assert portal.call(quick()) == "quick"
        assert time.monotonic() - started < 0.9  # it did not wait for the slow call to end
        t.join(5)
        assert out == ["slow"]
    finally:
        portal.close()


def test_a_busy_background_task_does_not_starve_callers() -> None:
    portal = Portal()
    spins = [0]
    try:

        async def spin() -> None:
            while True:
                spins[0] += 1
                await asyncio.sleep(0)

        async def start_spinning() -> None:
            asyncio.get_running_loop().create_task(spin())

        portal.call(start_spinning())
        before = spins[0]
        assert _wait_for(lambda: spins[0] > before + 100)  # the watcher keeps it going

        async def value() -> int:
            return 7

        for _ in range(20):
            assert portal.call(value()) == 7
    finally:
        portal.close()


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="needs Python's default Ctrl-C handler",
)
def test_ctrl_c_while_the_main_thread_drives_raises_between_steps() -> None:
    assert threading.current_thread() is threading.main_thread()
    portal = Portal()
    try:
        finished = threading.Event()

        async def long() -> None:
            await asyncio.sleep(0.5)
            finished.set()

        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            portal.call(long())
        assert time.monotonic() - started < 0.45
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
        assert finished.wait(5), "the interrupted coroutine did not go on in the background"

        async def value() -> int:
            return 3

        assert portal.call(value()) == 3  # the portal still works
    finally:
        portal.close()


def test_close_from_another_thread_ends_a_drive_with_closed_error() -> None:
    portal = Portal(what="the thing")
    driving = threading.Event()

    async def forever() -> None:
        driving.set()
        await asyncio.sleep(60)

    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            portal.call(forever())
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    assert driving.wait(5)
    portal.close()
    t.join(5)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ClosedError)
    assert "closed during the call" in str(outcome[0])
    assert portal.closed


def test_call_from_inside_the_portal_loop_is_refused() -> None:
    portal = Portal()
    try:

        async def nested() -> None:
            async def inner() -> None:
                return None

            coro = inner()
            with pytest.raises(RuntimeError, match="deadlock"):
                portal.call(coro)

        portal.call(nested())
    finally:
        portal.close()


def test_portal_calls_values_errors_and_close() -> None:
    portal = Portal(what="the thing")

    async def value(x: int) -> int:
        await asyncio.sleep(0)
        return x

    async def fail() -> None:
        raise KeyError("k")

    try:
        assert portal.call(value(3)) == 3
        assert portal.call(value(4), eager=True) == 4
        with pytest.raises(KeyError):
            portal.call(fail())
        with pytest.raises(KeyError):
            portal.call(fail(), eager=True)
        # from many threads at once
        out: list[int] = []
        threads = [
            threading.Thread(target=lambda i=i: out.append(portal.call(value(i)))) for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(out) == list(range(8))
    finally:
        portal.close()
    coro = value(1)
    with pytest.raises(ClosedError, match="the thing is closed"):
        portal.call(coro)


async def test_portal_works_inside_a_running_loop() -> None:
    portal = Portal()

    async def answer() -> int:
        return 42

    try:
        assert portal.call(answer()) == 42  # blocks this loop, as a notebook cell would
    finally:
        portal.close()
