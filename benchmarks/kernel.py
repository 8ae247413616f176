"""Kernel benchmarks: start, execute round trip, host-function round trip, vs a raw echo.

Run: ``.venv/bin/python benchmarks/kernel.py [--backend subprocess] [--n 2000]``. Prints medians
(p50) and p90s, and each round trip as a ratio to a raw Unix-socket msgpack echo measured in the
same run between the same kind of peers (a blocking client process, an asyncio server here).
Targets on a 2-core machine: start <= 40 ms, execute <= 150 us, host call <= 100 us and
<= 3x the raw echo.

``--compare subprocess,bwrap,docker`` adds start and execute p50 per backend, each as a ratio to
``subprocess`` measured in the same run (targets: bwrap start <= 60 ms and execute within 1.5x
of subprocess; docker start <= 400 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from typing import cast

import msgpack

import sunroom
from sunroom import AsyncKernel, Limits
from sunroom.sandbox.pool import KernelPool

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


async def bench_start(backend: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        async with AsyncKernel(backend=backend) as k:
            await k.execute("1")
            times.append((time.perf_counter() - t) * 1000)
    return times


async def bench_pooled_start(backend: str, n: int) -> list[float]:
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
    for _ in range(200):
        await k.execute("x += 1")
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        await k.execute("x += 1")
        times.append((time.perf_counter_ns() - t) / 1000)
    return times


async def bench_host_call(k: AsyncKernel, fn: str, n: int) -> list[float]:
    r = await k.execute(
        "import time\n"
        f"for i in range(200): {fn}(i)\n"
        "ts = []\n"
        f"for i in range({n}):\n"
        "    t = time.perf_counter_ns()\n"
        f"    {fn}(i)\n"
        "    ts.append(time.perf_counter_ns() - t)\n"
        "ts"
    )
    assert r.ok and r.value is not None, r
    return [int(x) / 1000 for x in r.value.strip("[]").split(",")]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--compare", default="", help="comma-separated backends to compare")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()

    async def ping(x: int) -> int:
        return x

    def ping_sync(x: int) -> int:
        return x

    print(
        f"sunroom {sunroom.__version__} kernel benchmarks, backend={args.backend}, "
        f"loop={args.loop}, python {sys.version.split()[0]}"
    )
    echo50, echo90 = await raw_echo(args.n)
    starts = await bench_start(args.backend, args.starts)
    pooled = await bench_pooled_start(args.backend, args.starts)
    async with AsyncKernel(
        backend=args.backend, functions=[ping, ping_sync], limits=Limits(timeout_s=120)
    ) as k:
        execs = await bench_execute(k, args.n)
        calls = await bench_host_call(k, "ping", args.n)
        sync_calls = await bench_host_call(k, "ping_sync", args.n)
    rows = [
        ("raw msgpack echo (UDS)", echo50, echo90, "us", None),
        ("kernel start -> first result", statistics.median(starts), pct(starts, 0.9), "ms", 40),
        (
            "  the same from a warm KernelPool",
            statistics.median(pooled),
            pct(pooled, 0.9),
            "ms",
            None,
        ),
        ("execute 'x += 1' round trip", statistics.median(execs), pct(execs, 0.9), "us", 150),
        ("host call (async fn)", statistics.median(calls), pct(calls, 0.9), "us", 100),
        (
            "host call (sync fn, thread)",
            statistics.median(sync_calls),
            pct(sync_calls, 0.9),
            "us",
            100,
        ),
    ]
    print(f"{'measure':34} {'p50':>10} {'p90':>10}  {'target':>8}  {'x echo':>7}")
    for name, p50, p90, unit, target in rows:
        ratio = f"{p50 / echo50:6.2f}x" if unit == "us" and name != rows[0][0] else ""
        tgt = f"<= {target}" if target else ""
        print(f"{name:34} {p50:8.1f}{unit:>2} {p90:8.1f}{unit:>2}  {tgt:>8}  {ratio:>7}")
    if args.compare:
        await compare([b for b in args.compare.split(",") if b], args.starts, args.n)


async def compare(names: list[str], starts: int, n: int) -> None:
    """Start and execute p50 per backend, as ratios to subprocess measured in this run."""
    figures: dict[str, tuple[float, float, float]] = {}
    for name in ["subprocess", *[b for b in names if b != "subprocess"]]:
        s = await bench_start(name, starts)
        w = await bench_pooled_start(name, starts)
        async with AsyncKernel(backend=name, limits=Limits(timeout_s=120)) as k:
            e = await bench_execute(k, n)
        figures[name] = (statistics.median(s), statistics.median(w), statistics.median(e))
    base_start, _, base_exec = figures["subprocess"]
    print()
    print(
        f"{'backend':12} {'start p50':>11} {'x subproc':>10} {'pooled p50':>11} "
        f"{'execute p50':>12} {'x subproc':>10}"
    )
    for name, (st, warm, ex) in figures.items():
        print(
            f"{name:12} {st:9.1f}ms {st / base_start:9.2f}x {warm:9.1f}ms "
            f"{ex:10.1f}us {ex / base_exec:9.2f}x"
        )


if __name__ == "__main__":
    if "--loop" in sys.argv and "uvloop" in sys.argv:
        import uvloop  # optional: pip install uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
