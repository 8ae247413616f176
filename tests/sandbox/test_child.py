"""Host children reaped through a pidfd on the event loop (sunroom.sandbox.child)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import pytest

from sunroom.sandbox import child


async def test_the_exit_code_is_reported_and_the_child_reaped() -> None:
    proc = child.spawn([sys.executable, "-c", "raise SystemExit(3)"])
    assert await asyncio.wait_for(proc.wait(), 20) == 3
    assert proc.returncode == 3
    assert await proc.wait() == 3  # again, at once
    with pytest.raises(ChildProcessError):  # reaped: no zombie left
        os.waitpid(proc.pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks
    proc.close()
    assert proc.pidfd is None


async def test_a_child_killed_by_a_signal_reports_minus_the_signal() -> None:
    proc = child.spawn(["sleep", "30"])
    assert proc.returncode is None
    assert proc.pidfd is not None
    proc.close()  # before the exit: a no-op, the pidfd stays for signalling
    assert proc.pidfd is not None
    signal.pidfd_send_signal(proc.pidfd, signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), 20) == -signal.SIGKILL


async def test_children_cost_the_host_no_thread() -> None:
    before = threading.active_count()
    procs = [child.spawn(["sleep", "30"]) for _ in range(5)]
    try:
        assert threading.active_count() == before
    finally:
        for p in procs:
            assert p.pidfd is not None
            signal.pidfd_send_signal(p.pidfd, signal.SIGKILL)
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 20)
        assert codes == [-signal.SIGKILL] * 5


async def test_without_pidfd_open_a_thread_waits_and_the_exit_still_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Linux before 5.3 has no ``pidfd_open``: a thread waits for the child instead."""

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    before = threading.active_count()
    proc = child.spawn([sys.executable, "-c", "import time; time.sleep(0.2); raise SystemExit(5)"])
    assert proc.pidfd is None
    assert threading.active_count() == before + 1
    assert await asyncio.wait_for(proc.wait(), 20) == 5
    assert proc.returncode == 5
    with pytest.raises(ChildProcessError):  # reaped by the thread: no zombie left
        os.waitpid(proc.pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks
    proc.close()  # nothing to close: a no-op
