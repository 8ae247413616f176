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
(ratios: the median of the per-round ratios). Targets on a 2-core machine: start <= 40 ms;
async execute <= 6x the echo; sync execute <= 1.2x the async one; host calls <= 4x the echo.

``--pin CPU`` runs everything on one CPU: on a shared 2-core VM the figures then move far less
from run to run (which CPU a woken process lands on otherwise dominates them).

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
from typing import Any, cast

import msgpack

import sunroom
from sunroom import AsyncKernel, JupyterBackend, Kernel, Limits, host_function
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.pool import KernelPool

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jupyter_baseline  # noqa: E402  (the plain jupyter-client side lives in its own module)

WARMUP = 200
"""Round trips run before each measured series (the echo client's own warm-up is the same)."""

ECHO_CLIENT = r"""
import socket, struct, sys, time, msgpack
s = socket.socket(fileno=int(sys.argv[1]))
n = int(sys.argv[2])
out = []
for i in range(n + 200):
    t = time.perf_counter_ns()
    p = msgpack.packb([0, i, "call", {"name": "ping", "args": {"x": i}}])
    s.sendall(struct.pack(">I", len(p)) + p)
    hdr = s.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack(">I", hdr)
    msgpack.unpackb(s.recv(size, socket.MSG_WAITALL))
    if i >= 200:
        out.append(time.perf_counter_ns() - t)
out.sort()
print(out[len(out) // 2], out[int(len(out) * 0.9)])
"""


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = cast(asyncio.Transport, transport)  # uvloop's do not subclass asyncio's
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4:
            size = int.from_bytes(self.buf[:4], "big")
            if len(self.buf) < 4 + size:
                return
            msg = msgpack.unpackb(bytes(self.buf[4 : 4 + size]))
            del self.buf[: 4 + size]
            reply = msgpack.packb([1, msg[1], None, msg[3]["args"]["x"]])
            self.t.write(len(reply).to_bytes(4, "big") + reply)


async def raw_echo(n: int) -> tuple[float, float]:
    mine, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_unix_connection(_Echo, sock=mine)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ECHO_CLIENT,
        str(theirs.fileno()),
        str(n),
        pass_fds=(theirs.fileno(),),
        stdout=subprocess.PIPE,
    )
    theirs.close()
    out, _ = await proc.communicate()
    transport.close()
    p50, p90 = (int(x) / 1000 for x in out.split())
    return p50, p90


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
    """p50 of every round trip per round; the figures are medians over the rounds."""

    def __init__(self) -> None:
        self.p50: dict[str, list[float]] = {name: [] for name in ROUND_TRIPS}
        self.p90: dict[str, list[float]] = {name: [] for name in ROUND_TRIPS}

    def add(self, name: str, times: list[float]) -> None:
        self.p50[name].append(statistics.median(times))
        self.p90[name].append(pct(times, 0.9))

    def add_echo(self, p50: float, p90: float) -> None:
        self.p50["echo"].append(p50)
        self.p90["echo"].append(p90)

    def median(self, name: str) -> float:
        return statistics.median(self.p50[name])

    def ratio(self, name: str, base: str = "echo") -> float:
        """Median over the rounds of the per-round ratio (both measured in the same round)."""
        return statistics.median(a / b for a, b in zip(self.p50[name], self.p50[base], strict=True))


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

    def step(name: str) -> None:
        if name == "echo":
            rounds.add_echo(*runner.run(raw_echo(args.n)))
        elif name == "async execute":
            rounds.add(name, runner.run(bench_execute(core, args.n)))
        elif name == "sync execute":
            rounds.add(name, bench_execute_sync(twin, args.n))
        elif HOST_FUNCTIONS[name] in core.registry.functions:
            rounds.add(name, runner.run(bench_host_call(core, HOST_FUNCTIONS[name], args.n)))

    try:
        for i in range(args.rounds):
            for name in ROUND_TRIPS if i % 2 == 0 else ROUND_TRIPS[::-1]:
                step(name)
    finally:
        twin.close()
        runner.run(core.aclose())
    return rounds


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
        print()
        print("round trips: p50 and p90 are medians over the rounds; 'x echo' is the median of")
        print("the per-round ratios to the raw echo measured in the same round")
        print(f"{'measure':36} {'p50':>10} {'p90':>10}  {'x echo':>7}  {'target':>9}")
        labels = {
            "echo": ("raw msgpack echo (UDS)", None),
            "async execute": ("execute 'x += 1' (AsyncKernel)", 6.0),
            "sync execute": ("execute 'x += 1' (Kernel, sync)", None),
            "async host call": ("host call (async fn)", 4.0),
            "sync host call": ("host call (sync fn, thread)", 4.0),
            "inline host call": ("host call (sync fn, inline=True)", 4.0),
        }
        for name in ROUND_TRIPS:
            if not rounds.p50[name]:
                continue  # inline=True is not in this tree
            label, target = labels[name]
            p50 = rounds.median(name)
            p90 = statistics.median(rounds.p90[name])
            ratio = "" if name == "echo" else f"{rounds.ratio(name):6.2f}x"
            tgt = f"<= {target:g}x" if target else ""
            print(f"{label:36} {p50:8.1f}us {p90:8.1f}us  {ratio:>7}  {tgt:>9}")
        sync_ratio = rounds.ratio("sync execute", "async execute")
        print(
            f"{'sync execute / async execute':36} {sync_ratio:8.2f}x {'':>10}  {'':>7}  "
            f"{'<= 1.2x':>9}"
        )
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
