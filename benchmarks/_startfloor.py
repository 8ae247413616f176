"""The floor under a kernel's cold start: a bare interpreter's start, measured in the same run.

``python -I -S -c pass`` (the interpreter the kernels run, isolated mode, no ``site``: the flags
the kernels start with), spawned from the asyncio loop the way a kernel is and waited for, p50
and p90 of *n*; and the same inside a minimal bubblewrap sandbox (a read-only view of ``/``, new
namespaces) for what bwrap itself adds. Issue 31's targets: a kernel's cold start (to its first
result) <= 2x the bare interpreter's start on subprocess, <= 2.5x on bwrap.

A kernel with limits also pays for its own cgroup: :func:`bare_start_in_cgroup` is the bare
interpreter started the way a kernel is, in a fresh cgroup with a memory and a pids limit that
the host moves it into while it starts (it waits to exit until moved). On cgroup v1 that move
waits out an RCU grace period (3 to 20 ms on the 2-core VM; ``/sys/kernel/rcu_expedited``
shortens it), a floor of the machine under every kernel start with limits.

:func:`least_imports_start` is the bare interpreter that also imports what any Python kernel of
this design must (threads, a socket, msgpack): the floor of the interpreter and its imports.

Processes are started as sunroom starts its kernels (``sunroom.sandbox.child``: ``Popen`` and a
pidfd on the loop), so the floor carries no more overhead than a kernel's start does.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import time

from sunroom.sandbox import child
from sunroom.sandbox.cgroup import Cgroup

BARE = ("-I", "-S", "-c", "pass")


async def _timed(argv: list[str]) -> float:
    t = time.perf_counter()
    proc = child.spawn(argv)
    if await proc.wait() != 0:
        raise RuntimeError(f"{argv[0]} exited with status {proc.returncode}")
    proc.close()
    return time.perf_counter() - t


GATED = ("-I", "-S", "-c", "import os; os.read(0, 3)")


async def _timed_in_cgroup() -> float:
    """One bare start in a fresh cgroup, moved in while it starts (the cgroup made and removed
    as a kernel's is; only the start until the interpreter's exit is timed)."""
    t = time.perf_counter()
    cgroup = await asyncio.to_thread(
        Cgroup.create, f"sunroom-floor-{secrets.token_hex(8)}", memory_mb=512, pids=64,
        cpu_quota=None,
    )  # fmt: skip
    if cgroup is None:
        raise RuntimeError(
            "no writable cgroup tree here: the floor with a cgroup cannot be measured"
        )
    gate_r, gate_w = os.pipe()
    try:
        proc = child.spawn([sys.executable, *GATED], stdin=gate_r, stdout=subprocess.DEVNULL)
        os.close(gate_r)
        await asyncio.to_thread(cgroup.add, proc.pid)
        os.write(gate_w, b"go\n")
        code = await proc.wait()
        elapsed = time.perf_counter() - t
        proc.close()
    finally:
        os.close(gate_w)
        await asyncio.to_thread(cgroup.remove)
    if code != 0:
        raise RuntimeError(f"the bare interpreter exited with status {code}")
    return elapsed


async def bare_start_in_cgroup(n: int) -> list[float]:
    """*n* starts (seconds) of a bare interpreter in a fresh cgroup of its own (see above)."""
    await _timed_in_cgroup()
    return [await _timed_in_cgroup() for _ in range(n)]


LEAST_IMPORTS = "import threading, _socket, msgpack"
"""What any Python kernel speaking msgpack-RPC over a socket, with threads, must import."""


async def least_imports_start(n: int) -> list[float]:
    """*n* starts (seconds) of a bare interpreter that imports :data:`LEAST_IMPORTS` and exits.

    A floor under a cold start that no Python kernel of this design goes below: the interpreter
    and the standard modules (``threading`` brings ``functools`` and ``collections``) and msgpack
    that a kernel needs before it can say hello. msgpack is found where this interpreter finds
    it, put first on ``sys.path`` as a kernel's start line puts its site directory.
    """
    import msgpack

    site_dir = os.path.dirname(os.path.dirname(msgpack.__file__))
    code = f"import sys; sys.path[0:0] = [{site_dir!r}]; {LEAST_IMPORTS}"
    argv = [sys.executable, "-I", "-S", "-c", code]
    await _timed(argv)  # warm the page cache
    return [await _timed(argv) for _ in range(n)]


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
