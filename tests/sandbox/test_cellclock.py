"""The cells' shared alarm and the clocks that use it (sunroom.sandbox.cellclock)."""

from __future__ import annotations

import asyncio

import pytest

from sunroom.sandbox.cellclock import Alarm, CellClock, CellLost


class _Proc:
    """A kernel process that only counts interrupts (the clock's one use of it)."""

    def __init__(self) -> None:
        self.interrupts = 0

    def interrupt(self) -> None:
        self.interrupts += 1


async def test_one_handle_serves_successive_deadlines() -> None:
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    fired: list[str] = []
    scheduled = len(loop._scheduled)  # type: ignore[attr-defined]
    alarm.set(0.05, lambda: fired.append("first"))
    alarm.clear()
    alarm.set(0.1, lambda: fired.append("second"))  # later: the same handle, set again on firing
    assert len(loop._scheduled) == scheduled + 1  # type: ignore[attr-defined]
    await asyncio.sleep(0.07)
    assert fired == []  # the handle fired for the first deadline and waits on for the second
    await asyncio.sleep(0.07)
    assert fired == ["second"]


async def test_an_earlier_deadline_replaces_the_handle() -> None:
    alarm = Alarm(asyncio.get_running_loop())
    fired: list[str] = []
    alarm.set(10.0, lambda: fired.append("late"))
    alarm.set(0.02, lambda: fired.append("soon"))
    await asyncio.sleep(0.05)
    assert fired == ["soon"]
    alarm.close()


async def test_cleared_or_closed_alarms_call_nothing() -> None:
    alarm = Alarm(asyncio.get_running_loop())
    fired: list[str] = []
    alarm.set(0.01, lambda: fired.append("cleared"))
    alarm.clear()
    assert alarm.left() == 0.0
    await asyncio.sleep(0.03)
    alarm.set(0.01, lambda: fired.append("closed"))
    alarm.close()
    await asyncio.sleep(0.03)
    assert fired == []


async def test_a_stopped_clock_leaves_the_next_cells_alone() -> None:
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    proc = _Proc()
    first = CellClock(loop.create_future(), proc, 0.02, 0.02, alarm=alarm)  # type: ignore[arg-type]
    first.stop()
    call: asyncio.Future[None] = loop.create_future()
    second = CellClock(call, proc, 0.05, 0.02, alarm=alarm)  # type: ignore[arg-type]
    first.pause()  # a stale clock (a thread the first cell left running) does nothing
    first.resume()
    await asyncio.sleep(0.03)
    assert proc.interrupts == 0 and not second.interrupted
    with pytest.raises(CellLost):
        await asyncio.wait_for(call, 1.0)  # interrupted at 0.05 s, given up 0.02 s later
    assert proc.interrupts == 1 and second.interrupted


async def test_a_paused_clock_keeps_its_time_on_the_shared_alarm() -> None:
    loop = asyncio.get_running_loop()
    alarm = Alarm(loop)
    proc = _Proc()
    call: asyncio.Future[None] = loop.create_future()
    clock = CellClock(call, proc, 0.05, 10.0, alarm=alarm)  # type: ignore[arg-type]
    clock.pause()
    await asyncio.sleep(0.08)
    assert proc.interrupts == 0
    clock.resume()
    await asyncio.sleep(0.08)
    assert proc.interrupts == 1
    clock.stop()
    alarm.close()
