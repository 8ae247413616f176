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
* many: ``kernel.fork(--copies)`` until every copy has answered its first cell (target: 32
  copies <= 60 ms in total), and the memory of the parent and all copies: the sum of their
  processes' PSS (``/proc/<pid>/smaps_rollup``) against one kernel's RSS (target: PSS <= 1.5x
  the parent's RSS + 4 MB per copy: copy-on-write shown, not assumed).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import psutil

from sunroom import AsyncKernel, KernelPool, Limits, Template

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


def kernel_pids(kernel: AsyncKernel) -> list[int]:
    """The host pids of *kernel*'s runtime and supervisor (a copy's or the parent's)."""
    proc = kernel.process
    runtime = getattr(proc, "runtime_pid", None) or getattr(proc, "kernel_pid", None)
    if runtime is None:
        runtime = getattr(getattr(proc, "root", None), "kernel_pid", None)
    if runtime is None:
        return []
    me = psutil.Process(runtime)
    return [runtime, me.ppid()]


async def cold(backend: str, limits: Limits) -> float:
    """Seconds from nothing to the first result of a kernel with numpy and pandas imported."""
    t = time.perf_counter()
    async with AsyncKernel(backend=backend, limits=limits) as k:
        r = await k.execute(SETUP + "\n1")
        assert r.ok, r
        return time.perf_counter() - t


async def run(args: argparse.Namespace) -> None:
    """Measure and print every figure (see the module docstring)."""
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
        parent_pids = kernel_pids(parent)
        rss = psutil.Process(parent_pids[0]).memory_info().rss
        t = time.perf_counter()
        copies = await parent.fork(args.copies)
        results = await asyncio.gather(*(c.execute("df.shape") for c in copies))
        many = time.perf_counter() - t
        assert all(r.ok for r in results), results
        pids = parent_pids + [pid for c in copies for pid in kernel_pids(c)]
        pss = sum(pss_kb(pid) for pid in pids) * 1024
        for c in copies:
            await c.aclose()
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
    print(f"{args.copies} copies at once to first cell:   {ms(many)}  (target <= 60 ms)")
    print(
        f"memory: parent RSS {rss / 1e6:.0f} MB; PSS of parent + {args.copies} copies "
        f"{pss / 1e6:.0f} MB; bound 1.5x RSS + 4 MB/copy = {bound / 1e6:.0f} MB "
        f"({'within' if pss <= bound else 'OVER'})"
    )


def main() -> None:
    """Parse the flags and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--n", type=int, default=20, help="single forks timed")
    parser.add_argument("--cold", type=int, default=5, help="cold starts timed")
    parser.add_argument("--copies", type=int, default=32, help="copies made at once")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
