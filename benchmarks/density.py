"""Density: N idle kernels on one machine, what each costs, and a live kernel meanwhile.

Starts one live kernel and measures its execute round trip (``x += 1``, p50/p99) with no other
kernel; then starts ``--n`` idle kernels (``--batch`` at a time), and reports:

* the time to start them all, and the host's MemAvailable before and after;
* PSS per idle kernel (``/proc/<pid>/smaps_rollup`` of every process under this one, divided
  by N), broken down by what the processes are (bwrap, the supervisor, the runtime, other),
  with each kind's private dirty memory (pages it alone holds: the supervisor and the runtime
  share the rest, the runtime being a fork of the supervisor), process count, threads and
  open file descriptors per kernel;
* the live kernel's execute p50/p99 again with the N idle kernels alive, and the ratio;
* once they are closed, the live kernel's p50/p99 alone once more, and the ratio to that (a
  p99 of a tenth of a millisecond moves with whatever else the VM does: two figures alone,
  before and after, show how far; ``--samples`` 2,000 each by default);
* the time to close them all (64 at a time; each ``aclose()``'s p50/p99, and the live
  kernel's alone), processes left under this one, and processes left with a kernel uid,
  when the last ``aclose()`` returned and after.

    .venv/bin/python benchmarks/density.py [--n 1000] [--backend bwrap] [--batch 16] [--template]

With ``--template`` the idle kernels are a bwrap ``Template``'s tenants (each forked from one
zygote, with its own uid and namespaces: docs/fork.md), the zygote counted with them.

Issue 31's targets on a 2-core machine with bwrap: PSS <= 6 MB per idle kernel, all started
<= 90 s, execute p99 with 999 idle <= 2x its p99 alone, 0 processes left after closing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sunroom import AsyncKernel, Template  # noqa: E402
from sunroom.sandbox.identity import uid_range  # noqa: E402


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _rollup(pid: int) -> tuple[int, int]:
    """(Pss, Private_Dirty) of *pid* in bytes, from ``smaps_rollup`` ((0, 0) once it is gone)."""
    pss = private = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
            elif line.startswith("Private_Dirty:"):
                private = int(line.split()[1]) * 1024
    except OSError:
        return 0, 0
    return pss, private


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return "gone"


def _kind(proc: psutil.Process) -> str:
    """bwrap, or what a process is by its place under bwrap: supervisor, runtime, other."""
    if _name(proc) == "bwrap":
        return "bwrap"
    try:
        chain = [p for p in proc.parents()]
    except psutil.Error:
        return "gone"
    for level, parent in enumerate(chain):
        if _name(parent) == "bwrap":
            return ("supervisor", "runtime")[level] if level < 2 else "a runtime's child"
    return "other: " + _name(proc)


def _breakdown(n: int, uids: set[int]) -> None:
    # procs, pss, threads, fds, private dirty
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for proc in psutil.Process().children(recursive=True):
        kind = _kind(proc)
        with contextlib.suppress(psutil.Error):
            uids.add(proc.uids().real)
        row = kinds[kind]
        row[0] += 1
        pss, private = _rollup(proc.pid)
        row[1] += pss
        row[4] += private
        try:
            row[2] += proc.num_threads()
            row[3] += proc.num_fds()
        except psutil.Error:
            pass
    total = sum(row[1] for row in kinds.values())
    print(f"PSS per idle kernel: {total / n / 1e6:.2f} MB (all kernel processes / {n})")
    for kind, (procs, pss, threads, fds, private) in sorted(
        kinds.items(), key=lambda kv: -kv[1][1]
    ):
        print(f"  {kind:<28} {procs / n:5.2f} procs  {pss / n / 1e6:6.2f} MB "
              f"({private / n / 1e6:.2f} private dirty)  "
              f"{threads / n:5.2f} threads  {fds / n:5.1f} fds  per kernel")  # fmt: skip
    me = psutil.Process()
    print(f"host process: {me.num_fds()} fds, {me.num_threads()} threads, "
          f"RSS {me.memory_info().rss / 1e6:.0f} MB")  # fmt: skip


async def _executes(kernel: AsyncKernel, samples: int) -> list[float]:
    await kernel.execute("x = 0")
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        result = await kernel.execute("x += 1")
        out.append((time.perf_counter() - t0) * 1000)
        if not result.ok:
            raise RuntimeError(f"execute failed: {result.error}")
    return out


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def _start_idle(
    args: argparse.Namespace, template: Template | None, started: float
) -> tuple[list[AsyncKernel], int]:
    """Start ``--n`` idle kernels, ``--batch`` at a time (a template's tenants with one)."""
    idle: list[AsyncKernel] = []
    failed = 0
    for i in range(0, args.n, args.batch):
        batch = [
            AsyncKernel(backend=args.backend, template=template)
            for _ in range(min(args.batch, args.n - i))
        ]
        results = await asyncio.gather(*(k.start() for k in batch), return_exceptions=True)
        for k, r in zip(batch, results, strict=True):
            if isinstance(r, BaseException):
                failed += 1
                if failed <= 3:
                    print(f"  a kernel failed to start: {type(r).__name__}: {r}")
            else:
                idle.append(k)
        if failed > 10:
            print("too many failures; stopping the starts")
            break
        if (i // args.batch) % 10 == 0:
            print(f"  {len(idle)} started ({time.perf_counter() - started:.1f} s)", flush=True)
    return idle, failed


async def main(args: argparse.Namespace) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB; backend {args.backend}; "
          f"RLIMIT_NOFILE {soft} -> {hard}")  # fmt: skip
    live = AsyncKernel(backend=args.backend)
    await live.start()
    await _executes(live, 50)  # warm
    alone = await _executes(live, args.samples)
    print(f"live execute alone: p50 {statistics.median(alone):.3f} ms, "
          f"p99 {_p(alone, 0.99):.3f} ms")  # fmt: skip
    before = _mem_available()
    started = time.perf_counter()
    template = None
    if args.template:  # one zygote (counted with the idle kernels), its tenants the kernels
        template = Template(backend=args.backend, max_kernels=args.n)
        await template.start()
    idle, failed = await _start_idle(args, template, started)
    took = time.perf_counter() - started
    after = _mem_available()
    print(f"started {len(idle)} idle kernels in {took:.1f} s ({failed} failed); "
          f"MemAvailable {before / 1e9:.2f} -> {after / 1e9:.2f} GB "
          f"({(before - after) / max(1, len(idle)) / 1e6:.2f} MB per kernel)")  # fmt: skip
    await asyncio.sleep(2)  # let the starts settle
    seen_uids: set[int] = set()
    _breakdown(len(idle) + 1, seen_uids)
    crowded = await _executes(live, args.samples)
    print(f"live execute with {len(idle)} idle: p50 {statistics.median(crowded):.3f} ms, "
          f"p99 {_p(crowded, 0.99):.3f} ms; p99 ratio {_p(crowded, 0.99) / _p(alone, 0.99):.2f}x "
          "(target <= 2x)")  # fmt: skip
    closing = time.perf_counter()
    closing_at = time.time()  # a process of another program's kernel that reuses a uid is newer
    closes: list[float] = []

    async def timed_close(kernel: AsyncKernel) -> None:
        t0 = time.perf_counter()
        await kernel.aclose()
        closes.append((time.perf_counter() - t0) * 1000)

    for i in range(0, len(idle), 64):
        await asyncio.gather(*(timed_close(k) for k in idle[i : i + 64]))
    again = await _executes(live, args.samples)  # alone once more: how far p99s move anyway
    print(f"live execute alone again: p50 {statistics.median(again):.3f} ms, "
          f"p99 {_p(again, 0.99):.3f} ms; the p99 with {len(idle)} idle is "
          f"{_p(crowded, 0.99) / _p(again, 0.99):.2f}x this one (target <= 2x)")  # fmt: skip
    if template is not None:
        await template.aclose()
    alone_close = time.perf_counter()
    await live.aclose()
    alone_close_ms = (time.perf_counter() - alone_close) * 1000
    print(f"closed all in {time.perf_counter() - closing:.1f} s; one aclose() 64 at a time: "
          f"p50 {statistics.median(closes or [0]):.1f} ms, p99 {_p(closes or [0], 0.99):.1f} ms; "
          f"the live kernel's alone: {alone_close_ms:.1f} ms")  # fmt: skip
    left = psutil.Process().children(recursive=True)
    ours = seen_uids & set(uid_range())  # other programs' kernels may run meanwhile

    def lingering() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["uids", "create_time"]):
            uids = proc.info["uids"]
            born = proc.info["create_time"]
            if uids is not None and uids.real in ours and born is not None and born < closing_at:
                found.append(proc)
        return found

    left_at_close = lingering()
    at_close = len(left_at_close)
    for proc in left_at_close[:5]:
        with contextlib.suppress(psutil.Error):
            print(f"  left: pid {proc.pid} ({_name(proc)}, ppid {proc.ppid()}, {proc.status()})")
    waited = time.perf_counter()
    count = len(lingering())
    while count and time.perf_counter() - waited < 30:  # polling the process table: no event
        await asyncio.sleep(0.1)
        count = len(lingering())
    print(f"left after closing: {len(left)} processes under this one; with its kernels' uids "
          f"{at_close} when aclose() returned, {count} after "
          f"{time.perf_counter() - waited:.1f} s (target 0)")  # fmt: skip
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--backend", default="bwrap")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument(
        "--template",
        action="store_true",
        help="make the idle kernels tenants of one bwrap Template (forks of one zygote, each "
        "with its own uid and namespaces) instead of starting each apart",
    )
    raise SystemExit(asyncio.run(main(parser.parse_args())))
