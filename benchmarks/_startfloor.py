"""The floor under a kernel's cold start: a bare interpreter's start, measured in the same run.

``python -I -S -c pass`` (the interpreter the kernels run, isolated mode, no ``site``: the flags
the kernels start with), spawned from the asyncio loop the way a kernel is and waited for, p50
and p90 of *n*; and the same inside a minimal bubblewrap sandbox (a read-only view of ``/``, new
namespaces) for what bwrap itself adds. Issue 31's targets: a kernel's cold start (to its first
result) <= 2x the bare interpreter's start on subprocess, <= 2.5x on bwrap.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time

BARE = ("-I", "-S", "-c", "pass")


async def _timed(argv: list[str]) -> float:
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv)
    if await proc.wait() != 0:
        raise RuntimeError(f"{argv[0]} exited with status {proc.returncode}")
    return time.perf_counter() - t


async def bare_start(n: int, *, bwrap: bool = False) -> list[float]:
    """*n* starts (seconds) of a bare interpreter, inside a minimal bwrap sandbox if *bwrap*."""
    argv = [sys.executable, *BARE]
    if bwrap:
        path = shutil.which("bwrap")
        if path is None:
            raise RuntimeError("bwrap is not installed (apt install bubblewrap)")
        argv = [
            path,
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--unshare-all",
            "--die-with-parent",
            *argv,
        ]  # fmt: skip
    await _timed(argv)  # warm the page cache
    return [await _timed(argv) for _ in range(n)]
