"""Bursts of kernel starts and closes lose no exit status (issue 26, item 6).

Each kernel's supervisor is a child of this process, reaped by asyncio's child watcher alone.
Signalling it through ``asyncio.subprocess.Process.send_signal`` made the standard library poll
(``waitpid``) first, reaping a supervisor that had just exited: the watcher then logged
"Unknown child process pid N, will report returncode 255" and reported 255 instead of its
status. The watcher's warning is a log record of the ``asyncio`` logger (not a Python warning),
so it is checked through the log.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from sunroom import AsyncKernel
from sunroom.sandbox.process import SupervisedProcess

ENDS = {
    "close": None,
    "exit": ("import os\nos._exit(7)", "exited with status 7"),
    "kill": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
}


async def _life(end: str) -> list[int | None]:
    """Start a kernel, end it as *end* says, close it; its supervisors' exit codes."""
    kernel = AsyncKernel(backend="subprocess")
    supervisors: list[SupervisedProcess] = []
    try:
        await kernel.start()
        assert isinstance(kernel.process, SupervisedProcess)
        supervisors.append(kernel.process)
        cell = ENDS[end]
        if cell is not None:
            result = await kernel.execute(cell[0])
            assert result.status == "died", result
            assert result.error is not None and cell[1] in result.error.message, result.error
            assert isinstance(kernel.process, SupervisedProcess)  # the restarted one
            supervisors.append(kernel.process)
    finally:
        await kernel.aclose()
    return [s.returncode for s in supervisors]


async def test_a_burst_of_kernel_starts_and_closes_reaps_every_child_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    ends = list(ENDS) * 10
    for _ in range(2):
        codes = await asyncio.gather(*(_life(end) for end in ends))
        assert all(code == 0 for per_kernel in codes for code in per_kernel), codes
    unknown = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not unknown, unknown
