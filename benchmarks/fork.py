"""Fork benchmarks (issue 13): copies of a live kernel against a cold start, same run.

Run: ``.venv/bin/python benchmarks/fork.py [--backend subprocess] [--n 20] [--copies 32]``
(or ``benchmarks/kernel.py --fork``, which runs this).

The parent kernel imports numpy and pandas and holds a 100 MB DataFrame (1,250,000 x 10
float64, made in a cell: a DataFrame is not a msgpack value, so it cannot be an input). Printed:

* cold: a new kernel started, numpy and pandas imported, its first result (median, p90 of
  ``--cold`` starts);
* fork: ``kernel.fork()`` until the copy has answered its first cell (``df.shape``), median and
  p90 of ``--n``, and the ratio of the cold median to it (targets: <= 5 ms on subprocess and
  bwrap, <= 25 ms on docker);
* template: ``Template(setup="import numpy as np, pandas as pd")``; ``template.kernel()`` until
  its first result, median and p90 of ``--n``, and the cold start's ratio to it (target: <= 5
  ms);
* pooled template: ``KernelPool(template=..., size=2)`` keeps forks ready;
  ``AsyncKernel(pool=pool)`` to its first result while a fork is ready (the warm path);
* a copy's shape (one process, where it has a cgroup of its own; else two) and its private
  memory (``Private_Clean`` + ``Private_Dirty``) at its first answer and after a ``df.sum()``
  cell (issue 31's target: <= 60 MB): the copy-on-write cost of a typical cell;
* many: ``kernel.fork(--copies)`` until every copy has answered its first cell, median and
  range of ``--many-runs`` batches (target: 32 copies <= 60 ms in total), and the memory of the parent and all copies: the sum of their
  processes' PSS (``/proc/<pid>/smaps_rollup``) against one kernel's RSS (target: PSS <= 1.5x
  the parent's RSS + 4 MB per copy: copy-on-write shown, not assumed);
* floor, in the same run: what the OS itself takes, in a plain process of this interpreter
  (``-I``, the kernel's scrubbed environment, sunroom not imported) holding the same state
  (numpy, pandas, the same DataFrame built the same way). Timed, median and p90 of ``--n``:
  ``os.fork()`` until it returns in the parent, until the child writes one byte on a pipe,
  and until the child replies to ``1+1`` sent over a socketpair made before the fork (the
  least a copy answering its first cell can cost); and ``--copies`` forks at once until all
  of them have answered (median and range of ``--many-runs`` batches), forked one after
  another by the parent, and forked as a binomial tree (each copy forks part of the rest, so
  that every core forks at once). Each child stays alive, as a copy does, until the timing is
  over, and every one is reaped; a child that fails prints its traceback. The same again after
  ``gc.freeze()`` (interleaved with the plain runs) and without the DataFrame (numpy and pandas
  only), to show what the collector's headers and the heap add. Where this process may make
  cgroups, also the floor with a **cgroup per child** (``own cgroup(s)``): each child moved
  into a new cgroup with a copy's limits (memory, pids) before it is sent ``1+1``, the cgroups
  made by a thread while the parent forks, each child placed as soon as it is forked, as
  sunroom places its copies (no copy runs its caller's code outside its limits); and the
  **floor of this design** (``this design``): the same, each child also doing what any copy of
  a Python kernel of this design does before it answers (its siblings' ends closed, two output
  pipes read by a thread of its own, its own workdir made by the parent before the forks, with
  ``HOME`` and ``TMPDIR`` following it, and ``1+1`` asked and answered as length-prefixed
  msgpack frames, compiled and evaluated). Then sunroom / floor ratios (issue 31's targets:
  one fork <= 2x the floor's answer, p50 and p90; the copies at once <= 1.5x the floor's),
  and against the floor with a cgroup per child and the floor of this design.
  ``--floor-only`` measures the floor alone. On docker the floor is measured on the host.
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import gc
import json
import os
import queue
import select
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback

import msgpack

# Nothing of sunroom (nor psutil) at the top: this file is also the floor's plain child process
# (``--floor-child``), which must hold only numpy, pandas and the DataFrame (and msgpack, which
# every kernel of this design holds: the floor of this design speaks it).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from sunroom import AsyncKernel, Limits

HERE = os.path.abspath(__file__)
"""This file: the floor's child process runs it with ``--floor-child``."""
SETUP = "import numpy as np, pandas as pd"
FRAME = "df = pd.DataFrame(np.random.default_rng(0).random((1_250_000, 10)))"


def pct(values: list[float], q: float) -> float:
    """The *q* quantile (0-1) of *values*, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    """*seconds* as milliseconds with one decimal."""
    return f"{seconds * 1000:.1f} ms"


def pss_kb(pid: int) -> int:
    """The proportional set size of *pid* in kB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _child(answer: int | socket.socket, release_r: int, release_w: int) -> None:
    """A floor child: answer at once (a byte on a pipe fd, or ``1+1`` evaluated over a
    socket), then stay alive, as a copy does, until the parent closes the release pipe; never
    returns."""
    code = 1
    try:
        if isinstance(answer, int):
            os.write(answer, b"x")
        else:
            answer.sendall(repr(eval(answer.recv(16))).encode())
        os.close(release_w)
        os.read(release_r, 1)  # EOF once the parent and every sibling closed the write end
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


ANSWER_TIMEOUT_S = 30.0
"""How long the floor waits for a child's answer before it fails."""


def _reap(pids: list[int], release_w: int) -> None:
    """Release the floor's children and wait for every one of them to end."""
    os.close(release_w)
    for pid in pids:
        os.waitpid(pid, 0)


def floor_one(over_socket: bool) -> tuple[float, float]:
    """Seconds from ``os.fork()`` to its return in the parent, and to the child's answer: one
    byte on a pipe, or (*over_socket*) the reply to ``1+1`` sent over a socketpair made before
    the fork."""
    release_r, release_w = os.pipe()
    pipe_r, pipe_w = os.pipe()
    ours, theirs = socket.socketpair()
    ours.settimeout(ANSWER_TIMEOUT_S)
    pids: list[int] = []
    try:
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(theirs if over_socket else pipe_w, release_r, release_w)
        forked = time.perf_counter() - t
        pids.append(pid)
        if over_socket:
            ours.sendall(b"1+1")
            assert ours.recv(16) == b"2"
        else:
            assert os.read(pipe_r, 1) == b"x"
        answered = time.perf_counter() - t
    finally:
        _reap(pids, release_w)
        for fd in (release_r, pipe_r, pipe_w):
            os.close(fd)
        ours.close()
        theirs.close()
    return forked, answered


def floor_many(copies: int, over_socket: bool) -> float:
    """Seconds from the first of *copies* ``os.fork()`` calls to the last child's answer (a
    byte on one shared pipe, or each child's reply to ``1+1`` over its own socketpair)."""
    release_r, release_w = os.pipe()
    pipe_r, pipe_w = os.pipe()
    pairs = [socket.socketpair() for _ in range(copies)] if over_socket else []
    for ours, _ in pairs:
        ours.settimeout(ANSWER_TIMEOUT_S)
    pids: list[int] = []
    try:
        t = time.perf_counter()
        for i in range(copies):
            pid = os.fork()
            if pid == 0:
                _child(pairs[i][1] if over_socket else pipe_w, release_r, release_w)
            pids.append(pid)
            if over_socket:
                pairs[i][0].sendall(b"1+1")
        if over_socket:
            assert all(ours.recv(16) == b"2" for ours, _ in pairs)
        else:
            got = 0
            while got < copies:
                got += len(os.read(pipe_r, copies - got))
        elapsed = time.perf_counter() - t
    finally:
        _reap(pids, release_w)
        for fd in (release_r, pipe_r, pipe_w):
            os.close(fd)
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
    return elapsed


def _tree_spawn(lo: int, hi: int, pairs: list[tuple[socket.socket, socket.socket]]) -> list[int]:
    """Fork copies *lo* to *hi* - 1 as a binomial tree: this process forks the first copy of
    each upper half, which makes the rest of that half; return the pids forked here."""
    pids = []
    while lo < hi:
        mid = (lo + hi) // 2
        pid = os.fork()
        if pid == 0:
            _tree_copy(mid, hi, pairs)
        pids.append(pid)
        hi = mid
    return pids


def _tree_copy(i: int, hi: int, pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    """Copy *i* of the tree: answer ``1+1`` on its socket, fork copies *i* + 1 to *hi* - 1,
    wait for the release (EOF on its socket), reap what it forked; never returns."""
    code = 1
    try:
        sock = pairs[i][1]
        sock.sendall(repr(eval(sock.recv(16))).encode())
        pids = _tree_spawn(i + 1, hi, pairs)
        for ours, _ in pairs:
            ours.close()  # so that the parent's close is this copy's EOF
        sock.recv(1)
        for pid in pids:
            os.waitpid(pid, 0)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def floor_tree(copies: int) -> float:
    """Seconds until *copies* children forked as a tree (:func:`_tree_spawn`; 2 cores fork at
    once) have all replied to ``1+1``, each over its own socketpair."""
    pairs = [socket.socketpair() for _ in range(copies)]
    pids: list[int] = []
    try:
        t = time.perf_counter()
        for ours, _ in pairs:
            ours.sendall(b"1+1")
        pids = _tree_spawn(0, copies, pairs)
        for ours, _ in pairs:
            ours.settimeout(ANSWER_TIMEOUT_S)
            assert ours.recv(16) == b"2"
        elapsed = time.perf_counter() - t
    finally:
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
        for pid in pids:  # each copy reaps the copies it forked before it ends
            os.waitpid(pid, 0)
    return elapsed


CGROUP_ROOT = "/sys/fs/cgroup"
COPY_MEMORY_MB = 4096
COPY_PIDS = 4096
"""The limits of each copy's cgroup: the benchmark kernel's ``Limits`` (:func:`sunroom_arm`)."""


def _cgroup_bases() -> list[tuple[str, str]]:
    """Where the floor makes a child's cgroup, as sunroom makes a copy's: ``(directory,
    controller)`` pairs beside this process's own cgroup, v2's one directory (``"unified"``) or
    v1's ``memory`` and ``pids``; empty when there is no writable cgroup tree. Written here
    rather than taken from ``sunroom.sandbox.cgroup``: the floor's process imports nothing of
    sunroom."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for ctrl in ctrls.split(",") if ctrls else [""]:
                own[ctrl] = path
    if os.path.exists(f"{CGROUP_ROOT}/cgroup.controllers"):
        pairs = [(CGROUP_ROOT + own.get("", "/").rstrip("/"), "unified")]
    else:
        pairs = []
        for ctrl in ("memory", "pids"):
            base = f"{CGROUP_ROOT}/{ctrl}{own.get(ctrl, '/').rstrip('/')}"
            pairs.append((base if os.path.isdir(base) else f"{CGROUP_ROOT}/{ctrl}", ctrl))
    return [(d, c) for d, c in pairs if os.access(d, os.W_OK)]


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _make_cgroup(bases: list[tuple[str, str]]) -> list[str]:
    """A new cgroup with a copy's limits (memory, pids) in every base; its directories."""
    name = f"sunroom-floor-{os.getpid()}-{time.perf_counter_ns()}"
    dirs = []
    for base, ctrl in bases:
        d = f"{base}/{name}"
        os.mkdir(d, 0o755)
        dirs.append(d)
        memory = str(COPY_MEMORY_MB * 1024 * 1024)
        if ctrl == "unified":
            _write(f"{d}/memory.max", memory)
            _write(f"{d}/pids.max", str(COPY_PIDS))
        elif ctrl == "memory":
            _write(f"{d}/memory.limit_in_bytes", memory)
        else:
            _write(f"{d}/pids.max", str(COPY_PIDS))
    return dirs


def _move(dirs: list[str], pid: int) -> None:
    for d in dirs:
        _write(f"{d}/cgroup.procs", str(pid))


def _remove_cgroups(made: list[list[str]]) -> None:
    """Remove the floor's cgroups once their children have ended."""
    for dirs in made:
        for d in dirs:
            os.rmdir(d)


REQUEST = {"id": 1, "method": "execute", "params": {"code": "1+1"}}
"""What the floor of this design asks each child, as a length-prefixed msgpack frame."""


def _frame(value: object) -> bytes:
    body = msgpack.packb(value)
    return len(body).to_bytes(4, "big") + body


def _read_frame(sock: socket.socket) -> Any:
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the other end hung up inside a frame")
        data += chunk
    return msgpack.unpackb(data[4:])


def _drain(fds: tuple[int, int]) -> None:
    """A design child's output reader: one thread reading both of its output pipes."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            os.read(fd, 65536)


def _design_child(
    sock: socket.socket, workdir: str, siblings: list[socket.socket], release_r: int,
    release_w: int,
) -> None:  # fmt: skip
    """A child of the floor of this design: what any copy of a Python kernel of this design
    does before it answers (close its siblings' ends, output pipes read by a thread of its own,
    its own workdir, a framed msgpack request decoded, its code compiled and evaluated, the
    answer framed back), then stay alive until released; never returns."""
    code = 1
    try:
        for other in siblings:
            if other is not sock:
                os.close(other.fileno())
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        _thread.start_new_thread(_drain, ((out_r, err_r),))
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
        request = _read_frame(sock)
        value = eval(compile(request["params"]["code"], "<cell>", "eval"), {})
        sock.sendall(_frame({"id": request["id"], "result": {"value": repr(value)}}))
        os.close(release_w)
        os.read(release_r, 1)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def floor_caged(copies: int, bases: list[tuple[str, str]], *, design: bool = False) -> float:
    """Seconds from the first of *copies* ``os.fork()`` calls to the last child's answer, each
    child moved first into a cgroup of its own with a copy's limits: a thread makes the cgroups
    while the parent forks, and moves each child and sends it its question as soon as it is
    forked (as sunroom places each copy as it is named).

    The question is ``1+1`` on a socketpair; with *design*, :data:`REQUEST` in a frame to a
    child that first does what any copy of this design does (:func:`_design_child`), in a
    workdir the parent makes for it before the forks (as sunroom's forking runtime does)."""
    release_r, release_w = os.pipe()
    pairs = [socket.socketpair() for _ in range(copies)]
    for ours, _ in pairs:
        ours.settimeout(ANSWER_TIMEOUT_S)
    pids: list[int] = []
    made: list[list[str]] = []
    forked: queue.SimpleQueue[int] = queue.SimpleQueue()
    failed: list[BaseException] = []
    question = _frame(REQUEST) if design else b"1+1"
    workdirs: list[str] = []

    def place() -> None:
        try:
            for _ in range(copies):
                made.append(_make_cgroup(bases))
            for i in range(copies):
                _move(made[i], forked.get())
                pairs[i][0].sendall(question)
        except BaseException as exc:
            failed.append(exc)

    try:
        t = time.perf_counter()
        if design:
            workdirs = [tempfile.mkdtemp(prefix="sunroom-floor-") for _ in range(copies)]
        placer = threading.Thread(target=place)
        placer.start()
        theirs = [pair[1] for pair in pairs]
        for i in range(copies):
            pid = os.fork()
            if pid == 0:
                if design:
                    _design_child(theirs[i], workdirs[i], theirs, release_r, release_w)
                _child(theirs[i], release_r, release_w)
            pids.append(pid)
            forked.put(pid)
        placer.join()
        if failed:
            raise failed[0]
        for ours, _ in pairs:
            if design:
                assert _read_frame(ours) == {"id": 1, "result": {"value": "2"}}
            else:
                assert ours.recv(16) == b"2"
        elapsed = time.perf_counter() - t
    finally:
        _reap(pids, release_w)
        os.close(release_r)
        for ours, their in pairs:
            ours.close()
            their.close()
        _remove_cgroups(made)
        for workdir in workdirs:
            os.rmdir(workdir)
    return elapsed


def floor_figures(n: int, copies: int, many_runs: int) -> dict[str, dict[str, list[float]]]:
    """The floor figures for this process's state, ``plain`` and after ``gc.freeze()``
    (interleaved, so that load and order weigh on both alike): *n* single forks each way and
    *many_runs* batches of *copies* forks each way, after one untimed batch."""
    floor_many(copies, over_socket=True)
    bases = _cgroup_bases()
    out: dict[str, dict[str, list[float]]] = {"plain": {}, "freeze": {}}
    for i in range(n):
        for mode in ("plain", "freeze") if i % 2 == 0 else ("freeze", "plain"):
            if mode == "freeze":
                gc.freeze()
            forked, byte = floor_one(over_socket=False)
            sample = {"fork_call": forked, "one_byte": byte}
            sample["one_answer"] = floor_one(over_socket=True)[1]
            if bases:
                sample["one_caged"] = floor_caged(1, bases)
                sample["one_design"] = floor_caged(1, bases, design=True)
            if i < many_runs:
                sample["many_byte"] = floor_many(copies, over_socket=False)
                sample["many_answer"] = floor_many(copies, over_socket=True)
                sample["many_tree"] = floor_tree(copies)
                if bases:
                    sample["many_caged"] = floor_caged(copies, bases)
                    sample["many_design"] = floor_caged(copies, bases, design=True)
            gc.unfreeze()
            for key, seconds in sample.items():
                out[mode].setdefault(key, []).append(seconds)
    return out


def rss_mb() -> float:
    """This process's resident set size in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def floor_child(n: int, copies: int, many_runs: int) -> None:
    """The floor's plain process: the kernel's state without sunroom; prints one JSON line."""
    exec(SETUP, globals())
    assert not any(m.split(".")[0] == "sunroom" for m in sys.modules), "sunroom was imported"
    out: dict[str, object] = {}
    for state in ("bare", "frame"):
        if state == "frame":
            exec(FRAME, globals())
        out[state] = floor_figures(n, copies, many_runs)
        out[state + "_rss_mb"] = rss_mb()
    print(json.dumps(out))


async def floor(n: int, copies: int, many_runs: int) -> dict[str, Any]:
    """Run :func:`floor_child` in a new process of this interpreter (``-I``, the kernel's
    scrubbed environment) and return its figures."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    argv = ["-I", HERE, "--floor-child", str(n), str(copies), str(many_runs)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, env=env, stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the floor process exited with status {proc.returncode}")
    figures: dict[str, Any] = json.loads(stdout)
    return figures


def kernel_pids(kernel: AsyncKernel) -> list[int]:
    """The host pids of *kernel*'s runtime and its supervisor, if it has one of its own."""
    import psutil

    proc = kernel.process
    runtime = getattr(proc, "runtime_pid", None) or getattr(proc, "kernel_pid", None)
    if runtime is None:
        runtime = getattr(getattr(proc, "root", None), "kernel_pid", None)
    if runtime is None:
        return []
    if getattr(proc, "single", False):  # a copy in one process (its parent is the kernel's)
        return [runtime]
    me = psutil.Process(runtime)
    return [runtime, me.ppid()]


async def cold(backend: str, limits: Limits) -> float:
    """Seconds from nothing to the first result of a kernel with numpy and pandas imported."""
    from sunroom import AsyncKernel

    t = time.perf_counter()
    async with AsyncKernel(backend=backend, limits=limits) as k:
        r = await k.execute(SETUP + "\n1")
        assert r.ok, r
        return time.perf_counter() - t


async def sunroom_arm(args: argparse.Namespace) -> tuple[float, float, float]:
    """Measure and print sunroom's figures; return the fork's median, the many copies' median
    time and the fork's p90 (seconds), for the ratios to the floor."""
    import psutil

    from sunroom import AsyncKernel, KernelPool, Limits, Template

    limits = Limits(timeout_s=120, memory_mb=4096, pids=4096)
    colds = [await cold(args.backend, limits) for _ in range(args.cold)]
    async with AsyncKernel(backend=args.backend, limits=limits) as parent:
        r = await parent.execute(SETUP + "\n" + FRAME + "\nint(df.memory_usage().sum())")
        assert r.ok, r
        frame_mb = int(r.value or 0) / 1e6
        (warm,) = await parent.fork()  # the family is made on the first fork
        await warm.aclose()
        forks = []
        for _ in range(args.n):
            t = time.perf_counter()
            (copy,) = await parent.fork()
            r = await copy.execute("df.shape")
            forks.append(time.perf_counter() - t)
            assert r.ok and r.value == "(1250000, 10)", r
            await copy.aclose()
        (copy,) = await parent.fork()
        shape = "one process" if getattr(copy.process, "single", False) else "two processes"
        copy_pid = kernel_pids(copy)[0]
        before = private_mb(copy_pid)
        r = await copy.execute("df.sum()")
        assert r.ok, r
        after = private_mb(copy_pid)
        await copy.aclose()
        parent_pids = kernel_pids(parent)
        rss = psutil.Process(parent_pids[0]).memory_info().rss
        manys = []
        for run in range(args.many_runs):
            t = time.perf_counter()
            copies = await parent.fork(args.copies)
            results = await asyncio.gather(*(c.execute("df.shape") for c in copies))
            manys.append(time.perf_counter() - t)
            assert all(r.ok for r in results), results
            if run == 0:
                pids = parent_pids + [pid for c in copies for pid in kernel_pids(c)]
                pss = sum(pss_kb(pid) for pid in pids) * 1024
            for c in copies:
                await c.aclose()
        many = statistics.median(manys)
    templated = []
    async with Template(setup=SETUP, backend=args.backend, limits=limits) as template:
        await (await template.kernel()).aclose()  # the first fork makes the family
        for _ in range(args.n):
            t = time.perf_counter()
            k = await template.kernel()
            r = await k.execute("pd.__name__")
            templated.append(time.perf_counter() - t)
            assert r.ok, r
            await k.aclose()
        pooled = []
        async with KernelPool(template=template, size=2) as pool:
            for _ in range(args.n):
                await pool.wait_ready()  # the warm path: a fork is ready when one is asked for
                t = time.perf_counter()
                async with AsyncKernel(pool=pool) as pk:
                    r = await pk.execute("pd.__name__")
                    pooled.append(time.perf_counter() - t)
                    assert r.ok, r
    target = 25 if args.backend == "docker" else 5
    cold_p50 = statistics.median(colds)
    template_p50 = statistics.median(templated)
    fork_p50 = statistics.median(forks)
    bound = 1.5 * rss + 4e6 * args.copies
    print(f"backend {args.backend}; parent holds a {frame_mb:.0f} MB DataFrame")
    print(f"cold start + import numpy, pandas: p50 {ms(cold_p50)}  p90 {ms(pct(colds, 0.9))}")
    print(
        f"fork to first cell:                p50 {ms(fork_p50)}  p90 {ms(pct(forks, 0.9))}"
        f"  (cold / fork = {cold_p50 / fork_p50:.0f}x; target <= {target} ms)"
    )
    print(
        f"template kernel to first result:   p50 {ms(template_p50)}  p90 {ms(pct(templated, 0.9))}"
        f"  (cold / template = {cold_p50 / template_p50:.0f}x; target <= 5 ms)"
    )
    pooled_p50 = statistics.median(pooled)
    print(
        f"pooled template fork to first:     p50 {ms(pooled_p50)}  p90 {ms(pct(pooled, 0.9))}"
        f"  (cold / pooled = {cold_p50 / pooled_p50:.0f}x; target <= 5 ms)"
    )
    print(
        f"{args.copies} copies at once to first cell:   p50 {ms(many)}  ({ms(min(manys))}-"
        f"{ms(max(manys))}, {args.many_runs} batches; target <= 60 ms)"
    )
    print(f"a copy is {shape}; its private memory: {before:.1f} MB at its first answer, ")
    print(f"  {after:.1f} MB after a df.sum() cell (issue 31's target: <= 60 MB)")
    print(
        f"memory: parent RSS {rss / 1e6:.0f} MB; PSS of parent + {args.copies} copies "
        f"{pss / 1e6:.0f} MB; bound 1.5x RSS + 4 MB/copy = {bound / 1e6:.0f} MB "
        f"({'within' if pss <= bound else 'OVER'})"
    )
    return fork_p50, many, pct(forks, 0.9)


def private_mb(pid: int) -> float:
    """The private memory of *pid* (clean + dirty, ``smaps_rollup``) in MB: what it alone holds."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total / 1024


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def floor_table(figures: dict[str, Any], n: int, copies: int, many_runs: int) -> None:
    """Print the floor's figures (from :func:`floor_child`)."""
    print(
        f"floor: a plain `python -I` (no sunroom) with the kernel's state; os.fork() until the "
        f"child answers; p50 / p90 of {n} (of {copies} forks at once: p50, min-max of "
        f"{many_runs})"
    )
    caged = "one_caged" in figures["frame"]["plain"]
    print(
        f"{'':30} {'fork() returns':>15} {'byte on pipe':>15} {'1+1 on socket':>15} "
        + (f"{'own cgroup':>15} {'this design':>15} " if caged else "")
        + f"{f'{copies} bytes':>17} {f'{copies} answers':>17} {'the same, a tree':>17}"
        + (f" {'own cgroups':>17} {'this design':>17}" if caged else "")
    )
    rows = [
        (f"numpy+pandas+frame ({figures['frame_rss_mb']:.0f} MB RSS)", "frame", "plain"),
        ("  the same after gc.freeze()", "frame", "freeze"),
        (f"numpy+pandas only ({figures['bare_rss_mb']:.0f} MB RSS)", "bare", "plain"),
        ("  the same after gc.freeze()", "bare", "freeze"),
    ]
    for label, state, mode in rows:
        f = figures[state][mode]
        one = [
            f"{statistics.median(f[k]) * 1e3:.1f} / {pct(f[k], 0.9) * 1e3:.1f} ms"
            for k in ("fork_call", "one_byte", "one_answer", "one_caged", "one_design")
            if k in f
        ]
        many = [
            f"{statistics.median(f[k]) * 1e3:.0f} ({min(f[k]) * 1e3:.0f}-{max(f[k]) * 1e3:.0f}) ms"
            for k in ("many_byte", "many_answer", "many_tree", "many_caged", "many_design")
            if k in f
        ]
        print(
            f"{label:30} {' '.join(f'{x:>15}' for x in one)} {' '.join(f'{x:>17}' for x in many)}"
        )


async def run(args: argparse.Namespace) -> None:
    """Measure and print every figure (see the module docstring): sunroom's, then the floor's
    in the same run, then their ratios."""
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; "
        f"Linux {os.uname().release}; load average {load()} at the start"
    )
    sunroom = None if args.floor_only else await sunroom_arm(args)
    figures = await floor(args.n, args.copies, args.many_runs)
    floor_table(figures, args.n, args.copies, args.many_runs)
    print(f"load average {load()} at the end")
    if sunroom is not None:
        fork_p50, many, fork_p90 = sunroom
        answers = figures["frame"]["plain"]["one_answer"]
        one = statistics.median(answers)
        all_ = statistics.median(figures["frame"]["plain"]["many_answer"])
        tree = statistics.median(figures["frame"]["plain"]["many_tree"])
        print(
            f"sunroom / floor (frame, 1+1 on socket): fork p50 {ms(fork_p50)} / {ms(one)} = "
            f"{fork_p50 / one:.1f}x, p90 {ms(fork_p90)} / {ms(pct(answers, 0.9))} = "
            f"{fork_p90 / pct(answers, 0.9):.1f}x (issue 31's target: <= 2x); "
            f"{args.copies} copies {ms(many)} / {ms(all_)} = {many / all_:.1f}x "
            f"(/ the tree's {ms(tree)} = {many / tree:.1f}x; target: <= 1.5x)"
        )
        plain = figures["frame"]["plain"]
        for key, name in (
            ("caged", "a cgroup per child (a copy's limits)"),
            ("design", "this design"),
        ):
            if f"one_{key}" not in plain:
                continue
            one_f = plain[f"one_{key}"]
            all_f = statistics.median(plain[f"many_{key}"])
            print(
                f"sunroom / the floor of {name}: fork p50 {ms(fork_p50)} / "
                f"{ms(statistics.median(one_f))} = {fork_p50 / statistics.median(one_f):.1f}x, "
                f"p90 {ms(fork_p90)} / {ms(pct(one_f, 0.9))} = {fork_p90 / pct(one_f, 0.9):.1f}x; "
                f"{args.copies} copies {ms(many)} / {ms(all_f)} = {many / all_f:.1f}x. That floor / "
                f"the plain floor: one {statistics.median(one_f) / one:.2f}x (target 2x), "
                f"{args.copies} {all_f / all_:.2f}x (target 1.5x)"
            )


def main() -> None:
    """Parse the flags and run."""
    if sys.argv[1:2] == ["--floor-child"]:
        floor_child(*(int(a) for a in sys.argv[2:5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--n", type=int, default=20, help="single forks timed")
    parser.add_argument("--cold", type=int, default=5, help="cold starts timed")
    parser.add_argument("--copies", type=int, default=32, help="copies made at once")
    parser.add_argument(
        "--many-runs", type=int, default=5, help="batches of --copies forks timed for the floor"
    )
    parser.add_argument(
        "--floor-only", action="store_true", help="measure the floor only (no kernel)"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
