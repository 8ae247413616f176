"""Template kernels as tenants of their own (issue 26): what the isolation costs, same run.

Run: ``.venv/bin/python benchmarks/template_tenants.py [--backend bwrap] [--n 20]``

A template whose setup imports numpy and pandas (``Template(setup=SETUP)``). Printed, median
and p90 of ``--n`` each, interleaved so that the machine's drift hits every arm alike:

* tenant: ``template.kernel()`` until the kernel has answered its first cell (``1``): a fork of
  the zygote that takes its own uid, PID/mount/IPC/net/UTS namespaces, fresh mounts and a
  masked ``/proc``, drops its capabilities and installs the seccomp filter (target <= 25 ms);
* shared fork (baseline): ``kernel.fork()`` of a kernel with the same setup until the copy has
  answered its first cell: the same fork with none of the isolation (one trust domain, what
  every template kernel was before issue 26);
* cold (baseline): a new kernel started and the setup run, until its first result.

Then the tenant / shared-fork ratio (what isolation adds) and cold / tenant.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from sunroom import AsyncKernel, Limits, Template

SETUP = "import numpy as np, pandas as pd"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


async def main(args: argparse.Namespace) -> None:
    limits = Limits(timeout_s=60, memory_mb=2048)
    tenant: list[float] = []
    shared: list[float] = []
    cold: list[float] = []
    async with (
        Template(setup=SETUP, backend=args.backend, limits=limits) as template,
        AsyncKernel(backend=args.backend, limits=limits) as parent,
    ):
        await parent.execute(SETUP)
        for _ in range(2):  # warm both paths (the first fork makes the family)
            await (await template.kernel()).aclose()
            for copy in await parent.fork(1):
                await copy.aclose()
        for i in range(args.n):
            t = time.perf_counter()
            k = await template.kernel()
            r = await k.execute("1")
            tenant.append(time.perf_counter() - t)
            assert r.ok, r
            await k.aclose()

            t = time.perf_counter()
            (copy,) = await parent.fork(1)
            r = await copy.execute("1")
            shared.append(time.perf_counter() - t)
            assert r.ok, r
            await copy.aclose()

            if i < args.cold:
                t = time.perf_counter()
                async with AsyncKernel(backend=args.backend, limits=limits) as fresh:
                    r = await fresh.execute(SETUP + "\n1")
                    cold.append(time.perf_counter() - t)
                    assert r.ok, r
    t50, s50, c50 = (statistics.median(x) for x in (tenant, shared, cold))
    print(f"backend {args.backend}, setup {SETUP!r}, n={args.n} (cold {args.cold})")
    print(
        f"tenant kernel to first result:  p50 {ms(t50)}  p90 {ms(p90(tenant))}  (target <= 25 ms)"
    )
    print(f"shared fork to first result:    p50 {ms(s50)}  p90 {ms(p90(shared))}  (baseline)")
    print(f"cold kernel + setup:            p50 {ms(c50)}  p90 {ms(p90(cold))}  (baseline)")
    print(f"tenant / shared fork = {t50 / s50:.2f}x   cold / tenant = {c50 / t50:.0f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="bwrap")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--cold", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
