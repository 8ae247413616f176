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


async def _timed(argv: list[str]) -> float:
    t = time.perf_counter()
    proc = child.spawn(argv)
    if await proc.wait() != 0:
        raise RuntimeError(f"{argv[0]} exited with status {proc.returncode}")
    proc.close()
    return time.perf_counter() - t


GATED = "import os; os.read(0, 3)"
"""What a floor process runs last when it is moved into a cgroup: it waits to be let go."""


def _minimal_bwrap() -> list[str]:
    path = shutil.which("bwrap")
    if path is None:
        raise RuntimeError("bwrap is not installed (apt install bubblewrap)")
    return [
        path,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--unshare-all",
        "--die-with-parent",
    ]  # fmt: skip


async def _timed_in_cgroup(argv: list[str]) -> float:
    """One start of *argv* (which reads its stdin before it exits) in a fresh cgroup, moved in
    while it starts (the cgroup made and removed as a kernel's is; only the start until the
    process's exit is timed, the cgroup's making included)."""
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
        proc = child.spawn(argv, stdin=gate_r, stdout=subprocess.DEVNULL)
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
        raise RuntimeError(f"{argv[0]} exited with status {code}")
    return elapsed


LEAST_IMPORTS = "import threading, _socket, msgpack"
"""What any Python kernel speaking msgpack-RPC over a socket, with threads, must import."""


def _code(imports: bool, gated: bool) -> str:
    """The ``-c`` program of a floor process: ``pass``, or :data:`LEAST_IMPORTS` (msgpack found
    where this interpreter finds it, put first on ``sys.path`` as a kernel's start line puts its
    site directory), then the gate when it is moved into a cgroup."""
    parts = []
    if imports:
        import msgpack

        site_dir = os.path.dirname(os.path.dirname(msgpack.__file__))
        parts += [f"import sys; sys.path[0:0] = [{site_dir!r}]", LEAST_IMPORTS]
    if gated:
        parts.append(GATED)
    return "; ".join(parts) or "pass"


async def floor_start(
    n: int, *, imports: bool = False, bwrap: bool = False, cgroup: bool = False
) -> list[float]:
    """*n* starts (seconds) of a floor process, after one untimed start (the page cache).

    The bare interpreter (``python -I -S``); with *imports*, importing :data:`LEAST_IMPORTS`
    first: the interpreter and the standard modules (``threading`` brings ``functools`` and
    ``collections``) and msgpack that any kernel of this design needs before it can say hello;
    with *bwrap*, inside a minimal bwrap sandbox (new namespaces, a read-only view of ``/``):
    what bwrap itself adds; with *cgroup*, moved into a fresh cgroup of its own while it
    starts (see the module docstring). Raises RuntimeError where bwrap or a writable cgroup
    tree is missing.
    """
    argv = [sys.executable, "-I", "-S", "-c", _code(imports, gated=cgroup)]
    if bwrap:
        argv = _minimal_bwrap() + argv
    if cgroup:
        await _timed_in_cgroup(argv)
        return [await _timed_in_cgroup(argv) for _ in range(n)]
    await _timed(argv)
    return [await _timed(argv) for _ in range(n)]


async def bare_start(n: int, *, bwrap: bool = False) -> list[float]:
    """*n* starts (seconds) of a bare interpreter, inside a minimal bwrap sandbox if *bwrap*."""
    return await floor_start(n, bwrap=bwrap)


async def bare_start_in_cgroup(n: int) -> list[float]:
    """*n* starts (seconds) of a bare interpreter in a fresh cgroup of its own."""
    return await floor_start(n, cgroup=True)


async def least_imports_start(n: int) -> list[float]:
    """*n* starts (seconds) of a bare interpreter that imports :data:`LEAST_IMPORTS` and exits:
    the floor of the interpreter and its imports, under which no Python kernel of this design
    goes."""
    return await floor_start(n, imports=True)


async def design_floor_start(n: int, *, bwrap: bool) -> list[float]:
    """*n* starts (seconds) of the least a kernel of this design is: the interpreter with
    :data:`LEAST_IMPORTS`, in a minimal bwrap sandbox if *bwrap*, moved into a cgroup of its
    own (its limits) while it starts. No seccomp filter, no uid of its own, no mounts of its
    own, no supervisor, no socket and no hello: every one of those only adds to it."""
    return await floor_start(n, imports=True, bwrap=bwrap, cgroup=True)
