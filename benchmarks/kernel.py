"""Kernel benchmarks: start, execute round trips, host-function round trips, vs a raw echo.

Run: ``.venv/bin/python benchmarks/kernel.py [--backend subprocess] [--n 2000] [--rounds 5]``.

Prints kernel start p50/p90, then every round trip as p50/p90 and as a ratio to a raw
Unix-socket msgpack echo measured in the same round between the same kind of peers (a blocking
client process, an asyncio server here):

* ``execute 'x += 1'`` through ``AsyncKernel`` and through the sync twin ``Kernel`` (called from
  a plain thread while no event loop runs on it), and their ratio;
* a host call from the kernel to an async function, to a sync one (on a thread, the default)
  and to a sync one declared ``inline=True`` (on the event loop), timed inside the kernel.

Each round measures every figure (``--n`` samples after a warm-up of ``WARMUP``); the order
alternates from one round to the next, and the figures are medians over ``--rounds`` rounds
(ratios: the median of the per-round ratios, p50 to p50 and p90 to p90). Targets on a 2-core
machine: start <= 40 ms; sync execute <= 1.2x the async one; and, as ratios to the echo (issue
31): async execute <= 2x, sync execute <= 2.5x, host calls <= 2.5x.

The echo's client runs on another CPU than its server (the loop's thread, for the echo only),
as a kernel runs on another CPU than the host's loop: left to the scheduler, the client often
shares the server's CPU and the echo then costs no cross-CPU wake-up (10 us against 60 us on the
2-core VM), which a kernel's round trip always pays (:func:`echo_cpus`).

``--pin CPU`` runs everything on one CPU: on a shared 2-core VM the figures then move far less
from run to run (which CPU a woken process lands on otherwise dominates them); the ratios then
compare CPU work alone.

``--profile`` adds where each round trip's time goes: the host's CPU, the kernel's, and the
rest (waiting for the other side to wake and answer), per round trip.

The cold start is also printed as a ratio to a bare interpreter's start measured in the same run
(``benchmarks/_startfloor.py``: ``python -I -S -c pass``, and with ``--backend bwrap`` the same in
a minimal bwrap sandbox; issue 31's targets: <= 2x on subprocess, <= 2.5x on bwrap), and to the
same interpreter importing what any Python kernel of this design must before its hello
(``threading``, ``_socket``, ``msgpack``): the floor of the interpreter and those imports. Where
sunroom may make cgroups, also to the **floor of this design**: that interpreter and those
imports, in a minimal bwrap on bwrap, moved into a cgroup of its own while it starts (a kernel's
limits), with no seccomp filter, uid, mounts, supervisor, socket or hello; the row below it says
whether the target ratio lies below that floor on this machine.

``--fork`` runs ``benchmarks/fork.py`` (forking a live kernel; its own flags may follow).

``--compare subprocess,bwrap,docker`` adds start, execute and host call p50 per backend, each as a
ratio to ``subprocess`` measured in the same run (targets: bwrap start <= 60 ms and execute
within 1.5x of subprocess; docker start <= 400 ms).

``--compare subprocess,jupyter`` adds two rows for the jupyter backend (ipykernel's ``python3``
with ``sandbox="none"`` and ``"bwrap"``) to that table, then ``benchmarks/jupyter_baseline.py``:
the same ipykernel driven by plain jupyter-client (no sunroom) beside the jupyter backend,
interleaved, start and execute p50 and their ratios (the issue's target: the jupyter backend
with ``sandbox="none"`` within 1.2x of plain jupyter-client).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple, cast

import msgpack

import sunroom
from sunroom import AsyncKernel, JupyterBackend, Kernel, Limits, host_function
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.pool import KernelPool

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _startfloor  # noqa: E402  (a bare interpreter's start, the floor under a cold start)
import jupyter_baseline  # noqa: E402  (the plain jupyter-client side lives in its own module)

WARMUP = 200
"""Round trips run before each measured series (the echo client's own warm-up is the same)."""

ECHO_CLIENT = r"""
import os, socket, struct, sys, time, msgpack
s = socket.socket(fileno=int(sys.argv[1]))
n = int(sys.argv[2])
if sys.argv[3:]:
    os.sched_setaffinity(0, {int(sys.argv[3])})
out = []
for i in range(n + 200):
    if i == 200:
        cpu0 = time.thread_time_ns()
    t = time.perf_counter_ns()
    p = msgpack.packb([0, i, "call", {"name": "ping", "args": {"x": i}}])
    s.sendall(struct.pack(">I", len(p)) + p)
    hdr = s.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack(">I", hdr)
    msgpack.unpackb(s.recv(size, socket.MSG_WAITALL))
    if i >= 200:
        out.append(time.perf_counter_ns() - t)
cpu = time.thread_time_ns() - cpu0
out.sort()
print(out[len(out) // 2], out[int(len(out) * 0.9)], cpu, sum(out) // len(out))
"""


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = cast(asyncio.Transport, transport)  # uvloop's do not subclass asyncio's
        self.buf = bytearray()
        self.count = 0
        self.cpu: list[float] = []  # thread CPU time at the end of the warm-up and at the end
        self.last = 0

    def data_received(self, data: bytes) -> None:
        self.count += 1
        if self.count in (WARMUP, self.last):
            self.cpu.append(time.thread_time())
        self.buf += data
        while len(self.buf) >= 4:
            size = int.from_bytes(self.buf[:4], "big")
            if len(self.buf) < 4 + size:
                return
            msg = msgpack.unpackb(bytes(self.buf[4 : 4 + size]))
            del self.buf[: 4 + size]
            reply = msgpack.packb([1, msg[1], None, msg[3]["args"]["x"]])
            self.t.write(len(reply).to_bytes(4, "big") + reply)


def echo_cpus(pin: int | None) -> tuple[set[int], set[int]] | None:
    """The CPUs of the echo's server thread and of its client: two different ones.

    A kernel is a process of its own, which the scheduler keeps on another CPU than the
    host's loop, so each of its round trips wakes the other CPU twice; an echo client left to
    the scheduler often shares the server's CPU instead (no cross-CPU wake-up: 10 us against
    60 us on the 2-core VM), and a ratio to that compares two different things. None (no
    pinning) under ``--pin`` or on one CPU.
    """
    if pin is not None:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, {cpus[1]}) if len(cpus) >= 2 else None


async def raw_echo(n: int, cpus: tuple[set[int], set[int]] | None = None) -> Echo:
    """The raw echo: p50 and p90 (us), and the CPU both sides spent per round trip (us).

    *cpus*: the server's (this thread's, for the echo only) and the client's CPUs.
    """
    mine, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, echo = await loop.create_unix_connection(_Echo, sock=mine)
    echo.last = n + WARMUP
    mask = os.sched_getaffinity(0)
    if cpus is not None:
        os.sched_setaffinity(0, cpus[0])  # this thread only (Linux): the loop's
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            ECHO_CLIENT,
            str(theirs.fileno()),
            str(n),
            *([] if cpus is None else [str(min(cpus[1]))]),
            pass_fds=(theirs.fileno(),),
            stdout=subprocess.PIPE,
        )
        theirs.close()
        out, _ = await proc.communicate()
    finally:
        os.sched_setaffinity(0, mask)
    transport.close()
    p50, p90, client_ns, mean = (int(x) for x in out.split())
    server_us = (echo.cpu[1] - echo.cpu[0]) * 1e6 / n
    return Echo(p50 / 1000, p90 / 1000, server_us, client_ns / 1000 / n, mean / 1000)


class Echo(NamedTuple):
    """What one echo series measured: p50 and p90, and CPU per round trip of both sides (us)."""

    p50: float
    p90: float
    server_cpu: float
    client_cpu: float
    mean: float


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


async def bench_start(backend: str | Backend, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        async with AsyncKernel(backend=backend) as k:
            await k.execute("1")
            times.append((time.perf_counter() - t) * 1000)
    return times


async def bench_pooled_start(backend: str | Backend, n: int) -> list[float]:
    """Start to first result when a warm kernel is waiting in a KernelPool."""
    times = []
    async with KernelPool(backend=backend, size=2) as pool:
        for _ in range(n):
            await pool.wait_ready()
            t = time.perf_counter()
            async with AsyncKernel(pool=pool) as k:
                await k.execute("1")
                times.append((time.perf_counter() - t) * 1000)
    return times


async def bench_execute(k: AsyncKernel, n: int) -> list[float]:
    await k.execute("x = 0")
    for _ in range(WARMUP):
        await k.execute("x += 1")
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        await k.execute("x += 1")
        times.append((time.perf_counter_ns() - t) / 1000)
    return times


def bench_execute_sync(k: Kernel, n: int) -> list[float]:
    """The same as :func:`bench_execute` through the sync twin, from a plain thread."""
    k.execute("x = 0")
    for _ in range(WARMUP):
        k.execute("x += 1")
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        k.execute("x += 1")
        times.append((time.perf_counter_ns() - t) / 1000)
    return times


HOST_CALL_CELL = (
    "import time\n"
    "for i in range({warmup}): {fn}(i)\n"
    "ts = []\n"
    "for i in range({n}):\n"
    "    t = time.perf_counter_ns()\n"
    "    {fn}(i)\n"
    "    ts.append(time.perf_counter_ns() - t)\n"
    "print(','.join(map(str, ts)))"  # stdout, not the value: a long repr is cut in the middle
)


async def bench_host_call(k: AsyncKernel, fn: str, n: int) -> list[float]:
    """Round trips of a host call, timed inside the kernel around the generated wrapper."""
    r = await k.execute(HOST_CALL_CELL.format(fn=fn, n=n, warmup=WARMUP))
    assert r.ok and r.truncated_bytes == 0, r
    return [int(x) / 1000 for x in r.stdout.split(",")]


async def ping(x: int) -> int:
    """Async host function: returns its argument."""
    return x


def ping_sync(x: int) -> int:
    """Sync host function (the default: on a worker thread): returns its argument."""
    return x


def ping_inline(x: int) -> int:
    """Sync host function declared ``inline=True`` (on the event loop): returns its argument."""
    return x


ROUND_TRIPS = (
    "echo",
    "async execute",
    "sync execute",
    "async host call",
    "sync host call",
    "inline host call",
)
HOST_FUNCTIONS = {
    "async host call": "ping",
    "sync host call": "ping_sync",
    "inline host call": "ping_inline",
}


class Rounds:
    """p50 and p90 of every round trip per round; the figures are medians over the rounds.

    With ``--profile``, also where each round trip's time went: the mean wall time, the host's
    CPU (every thread of this process) and the kernel's (every thread of its process), per
    round trip; the rest is waiting (wake-ups, the socket).
    """

    def __init__(self) -> None:
        self.p50: dict[str, list[float]] = {name: [] for name in ROUND_TRIPS}
        self.p90: dict[str, list[float]] = {name: [] for name in ROUND_TRIPS}
        self.split: dict[str, list[tuple[float, float, float]]] = {n: [] for n in ROUND_TRIPS}

    def add(self, name: str, times: list[float]) -> None:
        self.p50[name].append(statistics.median(times))
        self.p90[name].append(pct(times, 0.9))

    def add_echo(self, echo: Echo) -> None:
        self.p50["echo"].append(echo.p50)
        self.p90["echo"].append(echo.p90)
        self.split["echo"].append((echo.mean, echo.server_cpu, echo.client_cpu))

    def median(self, name: str, of: str = "p50") -> float:
        return statistics.median(self.p50[name] if of == "p50" else self.p90[name])

    def ratio(self, name: str, base: str = "echo", of: str = "p50") -> float:
        """Median over the rounds of the per-round ratio (both measured in the same round)."""
        mine, theirs = (
            (self.p50[name], self.p50[base]) if of == "p50" else (self.p90[name], self.p90[base])
        )
        return statistics.median(a / b for a, b in zip(mine, theirs, strict=True))


def kernel_cpu(pid: int | None) -> float:
    """CPU seconds every thread of process *pid* has run (0.0 when it cannot be read)."""
    if pid is None:
        return 0.0
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except OSError:
        return 0.0
    return total / 1e9


class Split:
    """Wall time, host CPU and kernel CPU over a series of *ops* round trips (``--profile``)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.wall = time.perf_counter()
        self.host = time.process_time()
        self.kernel = kernel_cpu(pid)

    def per_op(self, ops: int) -> tuple[float, float, float]:
        """(wall, host CPU, kernel CPU) per round trip, in us."""
        return (
            (time.perf_counter() - self.wall) * 1e6 / ops,
            (time.process_time() - self.host) * 1e6 / ops,
            (kernel_cpu(self.pid) - self.kernel) * 1e6 / ops,
        )


def measure_round_trips(args: argparse.Namespace, runner: asyncio.Runner) -> Rounds:
    """Every round trip, *args.rounds* times; the order alternates from one round to the next."""
    rounds = Rounds()
    limits = Limits(timeout_s=120)
    functions: list[Any] = [ping, ping_sync]
    if "inline" in inspect.signature(host_function).parameters:
        functions.append(host_function(ping_inline, inline=True))
    core = AsyncKernel(backend=args.backend, functions=functions, limits=limits)
    runner.run(core.start())
    twin = Kernel(backend=args.backend, functions=functions, limits=limits)
    twin.start()

    cpus = echo_cpus(args.pin)
    pids = {"core": pid_of(core), "twin": pid_of(twin)}

    def step(name: str) -> None:
        split = Split(pids["twin" if name == "sync execute" else "core"])
        if name == "echo":
            rounds.add_echo(runner.run(raw_echo(args.n, cpus)))
            return
        if name == "async execute":
            rounds.add(name, runner.run(bench_execute(core, args.n)))
        elif name == "sync execute":
            rounds.add(name, bench_execute_sync(twin, args.n))
        elif HOST_FUNCTIONS[name] in core.registry.functions:
            rounds.add(name, runner.run(bench_host_call(core, HOST_FUNCTIONS[name], args.n)))
        else:
            return
        rounds.split[name].append(split.per_op(args.n + WARMUP + 1))

    try:
        for i in range(args.rounds):
            for name in ROUND_TRIPS if i % 2 == 0 else ROUND_TRIPS[::-1]:
                step(name)
    finally:
        twin.close()
        runner.run(core.aclose())
    return rounds


LABELS: dict[str, tuple[str, float | None]] = {
    "echo": ("raw msgpack echo (UDS)", None),
    "async execute": ("execute 'x += 1' (AsyncKernel)", 2.0),
    "sync execute": ("execute 'x += 1' (Kernel, sync)", 2.5),
    "async host call": ("host call (async fn)", 2.5),
    "sync host call": ("host call (sync fn, thread)", 2.5),
    "inline host call": ("host call (sync fn, inline=True)", 2.5),
}
"""Each round trip's label and its target (as a ratio to the echo; issue 31)."""


def print_split(rounds: Rounds) -> None:
    """``--profile``: where a round trip's time goes (medians over the rounds, us)."""
    print()
    print("where the time goes, per round trip (us; medians over the rounds): the host's CPU")
    print("(every thread of this process), the kernel's (every thread of its process), and the")
    print("rest, waiting: wake-ups of the other side and the socket. Wall is the mean round trip;")
    print("the echo's two sides are its server (this loop) and its client.")
    print(f"{'measure':36} {'wall':>8} {'host CPU':>9} {'kernel CPU':>11} {'waiting':>8}")
    for name in ROUND_TRIPS:
        if not rounds.split[name]:
            continue
        wall, host, kernel = (statistics.median(x) for x in zip(*rounds.split[name], strict=True))
        rest = wall - host - kernel
        print(f"{LABELS[name][0]:36} {wall:8.1f} {host:9.1f} {kernel:11.1f} {rest:8.1f}")


def pid_of(kernel: AsyncKernel | Kernel) -> int | None:
    """The kernel's process in the host's PID namespace, when the backend can tell."""
    proc = kernel.process
    return None if proc is None else proc.host_pid


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--n", type=int, default=2000, help="samples per round trip per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--compare", default="", help="comma-separated backends to compare")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument(
        "--pin",
        type=int,
        default=None,
        metavar="CPU",
        help="run on this CPU only (the kernels and the echo client inherit it)",
    )
    parser.add_argument(
        "--fork", action="store_true", help="run benchmarks/fork.py instead (its own flags follow)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print where each round trip's time goes (host CPU, kernel CPU, waiting)",
    )
    argv = sys.argv[1:]
    if "--fork" in argv:  # every flag after it is fork.py's, even one this parser knows (--n)
        cut = argv.index("--fork") + 1
        args, rest = parser.parse_args(argv[:cut]), argv[cut:]
    else:
        args, rest = parser.parse_known_args(argv)
    if args.fork:
        import runpy

        sys.argv = [str(Path(__file__).with_name("fork.py")), "--backend", args.backend, *rest]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
    factory = None
    if args.loop == "uvloop":
        import uvloop  # optional: pip install uvloop

        factory = uvloop.new_event_loop
    print(
        f"sunroom {sunroom.__version__} kernel benchmarks, backend={args.backend}, "
        f"loop={args.loop}, python {sys.version.split()[0]}, {os.cpu_count()} cpus"
        f"{'' if args.pin is None else f' (pinned to cpu {args.pin})'}, "
        f"{args.rounds} rounds x {args.n} samples"
    )
    with asyncio.Runner(loop_factory=factory) as runner:
        starts = runner.run(bench_start(args.backend, args.starts))
        pooled = runner.run(bench_pooled_start(args.backend, args.starts))
        rounds = measure_round_trips(args, runner)
        print(f"{'measure':36} {'p50':>10} {'p90':>10}  {'target':>9}")
        print(
            f"{'kernel start -> first result':36} {statistics.median(starts):8.1f}ms "
            f"{pct(starts, 0.9):8.1f}ms  {'<= 40ms':>9}"
        )
        print(
            f"{'  the same from a warm KernelPool':36} {statistics.median(pooled):8.1f}ms "
            f"{pct(pooled, 0.9):8.1f}ms"
        )
        bare = [t * 1000 for t in runner.run(_startfloor.bare_start(args.starts))]
        print(
            f"{'bare `python -I -S -c pass` (floor)':36} {statistics.median(bare):8.1f}ms "
            f"{pct(bare, 0.9):8.1f}ms"
        )
        if args.backend == "bwrap":
            boxed = [t * 1000 for t in runner.run(_startfloor.bare_start(args.starts, bwrap=True))]
            print(
                f"{'  the same in a minimal bwrap':36} {statistics.median(boxed):8.1f}ms "
                f"{pct(boxed, 0.9):8.1f}ms"
            )
        limit = 2.5 if args.backend == "bwrap" else 2.0
        print(
            f"{'cold start / bare interpreter':36} "
            f"{statistics.median(starts) / statistics.median(bare):9.2f}x "
            f"{pct(starts, 0.9) / pct(bare, 0.9):9.2f}x  {f'<= {limit:g}x':>9}"
        )
        least = [t * 1000 for t in runner.run(_startfloor.least_imports_start(args.starts))]
        print(
            f"{'bare + threading, _socket, msgpack':36} {statistics.median(least):8.1f}ms "
            f"{pct(least, 0.9):8.1f}ms"
        )
        print(
            f"{'  / bare interpreter':36} "
            f"{statistics.median(least) / statistics.median(bare):9.2f}x "
            f"{pct(least, 0.9) / pct(bare, 0.9):9.2f}x"
        )
        print(
            f"{'cold start / bare + those imports':36} "
            f"{statistics.median(starts) / statistics.median(least):9.2f}x "
            f"{pct(starts, 0.9) / pct(least, 0.9):9.2f}x"
        )
        try:
            caged = [t * 1000 for t in runner.run(_startfloor.bare_start_in_cgroup(args.starts))]
            design = [
                t * 1000
                for t in runner.run(
                    _startfloor.design_floor_start(args.starts, bwrap=args.backend == "bwrap")
                )
            ]
        except RuntimeError as exc:
            print(f"(no floor with a cgroup: {exc})")
        else:
            print(
                f"{'bare, moved into its own cgroup':36} {statistics.median(caged):8.1f}ms "
                f"{pct(caged, 0.9):8.1f}ms"
            )
            print(
                f"{'cold start / bare in a cgroup':36} "
                f"{statistics.median(starts) / statistics.median(caged):9.2f}x "
                f"{pct(starts, 0.9) / pct(caged, 0.9):9.2f}x"
            )
            where = "in a minimal bwrap, " if args.backend == "bwrap" else ""
            print(
                f"{'floor of this design':36} {statistics.median(design):8.1f}ms "
                f"{pct(design, 0.9):8.1f}ms  (those imports, {where}in its own cgroup)"
            )
            floor_ratio = statistics.median(design) / statistics.median(bare)
            print(
                f"{'  / bare interpreter':36} {floor_ratio:9.2f}x "
                f"{pct(design, 0.9) / pct(bare, 0.9):9.2f}x  "
                f"(target {limit:g}x: {'below this floor' if floor_ratio > limit else 'reachable'})"
            )
            print(
                f"{'cold start / floor of this design':36} "
                f"{statistics.median(starts) / statistics.median(design):9.2f}x "
                f"{pct(starts, 0.9) / pct(design, 0.9):9.2f}x"
            )
        print()
        print("round trips: p50 and p90 are medians over the rounds; 'x echo' is the median of")
        print("the per-round ratios to the raw echo measured in the same round (p50 to p50, p90")
        print("to p90). The echo's client runs on another CPU than its server, as a kernel does")
        print("(unless --pin): see echo_cpus.")
        print(f"{'measure':36} {'p50':>10} {'p90':>10}  {'x echo':>7} {'p90 x':>7}  {'target':>9}")
        for name in ROUND_TRIPS:
            if not rounds.p50[name]:
                continue  # inline=True is not in this tree
            label, target = LABELS[name]
            p50, p90 = rounds.median(name), rounds.median(name, "p90")
            ratio = "" if name == "echo" else f"{rounds.ratio(name):6.2f}x"
            ratio90 = "" if name == "echo" else f"{rounds.ratio(name, of='p90'):6.2f}x"
            tgt = f"<= {target:g}x" if target else ""
            print(f"{label:36} {p50:8.1f}us {p90:8.1f}us  {ratio:>7} {ratio90:>7}  {tgt:>9}")
        sync_ratio = rounds.ratio("sync execute", "async execute")
        print(
            f"{'sync execute / async execute':36} {sync_ratio:8.2f}x {'':>10}  {'':>7} {'':>7}  "
            f"{'<= 1.2x':>9}"
        )
        if args.profile:
            print_split(rounds)
        if args.compare:
            runner.run(compare([b for b in args.compare.split(",") if b], args.starts, args.n))


def compared_backends(names: list[str]) -> list[tuple[str, str | Backend]]:
    """The rows of ``--compare``: subprocess first; ``jupyter`` is two rows (none and bwrap)."""
    rows: list[tuple[str, str | Backend]] = []
    for name in ["subprocess", *[b for b in names if b != "subprocess"]]:
        if name == "jupyter":
            for sandbox in ("none", "bwrap"):
                rows.append((f"jupyter ({sandbox})", JupyterBackend("python3", sandbox=sandbox)))
        else:
            rows.append((name, name))
    return rows


async def compare(names: list[str], starts: int, n: int) -> None:
    """Start, execute and host call p50 per backend, as ratios to subprocess in this run.

    With ``jupyter`` among *names*, then the side-by-side with plain jupyter-client
    (``jupyter_baseline.report``).
    """
    figures: dict[str, tuple[float, float | None, float, float]] = {}
    for label, backend in compared_backends(names):
        s = await bench_start(backend, starts)
        try:
            w: float | None = statistics.median(await bench_pooled_start(backend, starts))
        except sunroom.SunroomError as exc:  # a backend a pool cannot keep: said, not hidden
            print(f"{label}: no pooled start ({exc})")
            w = None
        limits = Limits(timeout_s=120)
        async with AsyncKernel(backend=backend, functions=[ping], limits=limits) as k:
            e = await bench_execute(k, n)
            h = await bench_host_call(k, "ping", n)
        figures[label] = (
            statistics.median(s),
            w,
            statistics.median(e),
            statistics.median(h),
        )
    base_start, _, base_exec, base_call = figures["subprocess"]
    print()
    print(
        f"{'backend':16} {'start p50':>11} {'x subproc':>10} {'pooled p50':>11} "
        f"{'execute p50':>12} {'x subproc':>10} {'host call p50':>14} {'x subproc':>10}"
    )
    for label, (st, warm, ex, call) in figures.items():
        pooled = f"{warm:9.1f}ms" if warm is not None else f"{'-':>11}"
        print(
            f"{label:16} {st:9.1f}ms {st / base_start:9.2f}x {pooled} "
            f"{ex:10.1f}us {ex / base_exec:9.2f}x {call:12.1f}us {call / base_call:9.2f}x"
        )
    if "jupyter" in names:
        await jupyter_baseline.report(min(starts, 10), max(50, n // 5), 5)


if __name__ == "__main__":
    main()
