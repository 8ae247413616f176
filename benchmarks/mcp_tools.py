"""MCP benchmarks (issue 14): binding a 50-tool server, and the per-call overhead, same run.

(Not named ``mcp.py``: with ``benchmarks/`` on ``sys.path``, as the rlm_eval tests put it, that
name would shadow the ``mcp`` SDK.)

Run: ``.venv/bin/python benchmarks/mcp_tools.py [--backend subprocess] [--n 200] [--tools 50]``

Printed (medians, with p90):

* kernel start: ``AsyncKernel(backend=...)`` with no server, start to its first result (the
  baseline the binding is added to);
* bind: the test server (``tests/mcp/toolserver.py``, SDK ``MCPServer``) with ``--tools`` tools,
  already started and connected; from there, ``AsyncKernel(mcp=...)`` start (list the tools,
  build host functions and wrappers, boot the kernel, install them) until a cell has called a
  tool (target: <= 200 ms, kernel boot included);
* call: ``tracker.add(1, 2)`` from a cell, the whole cell (kernel -> host -> stdio server and
  back), against ``ClientSession.call_tool("add")`` made directly on the host over the same
  connection; the difference is sunroom's overhead (target: <= 1 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import sunroom
from sunroom import AsyncKernel
from sunroom.mcp.toolset import Toolset

SERVER = str(Path(__file__).resolve().parent.parent / "tests" / "mcp" / "toolserver.py")


def pct(values: list[float], q: float) -> float:
    """The *q* quantile (0-1) of *values*, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(label: str, values: list[float]) -> float:
    """Print median and p90 in ms; return the median."""
    med = statistics.median(values)
    print(f"{label:<44} median {med * 1000:8.2f} ms   p90 {pct(values, 0.9) * 1000:8.2f} ms")
    return med


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--n", type=int, default=200, help="calls per arm")
    parser.add_argument("--binds", type=int, default=10, help="bind measurements")
    parser.add_argument("--tools", type=int, default=50, help="tools on the server")
    args = parser.parse_args()
    extra = max(0, args.tools - 11)  # the test server has 11 tools of its own
    server = sunroom.mcp.stdio(
        sys.executable, [SERVER, "stdio", "--extra", str(extra)], name="tracker"
    )
    print(f"backend={args.backend}, {11 + extra} tools, python {sys.version.split()[0]}")
    t = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i
    print(f"machine speed now: a 5M-step Python loop takes {time.perf_counter() - t:.2f} s")

    boots = []
    for _ in range(args.binds):
        t = time.perf_counter()
        async with AsyncKernel(backend=args.backend) as k:
            await k.execute("1")
            boots.append(time.perf_counter() - t)
    boot = show("kernel start, no MCP (baseline)", boots)

    binds = []
    for _ in range(args.binds):
        toolset = Toolset([server])
        await toolset.connect()  # the server is up and has answered the handshake
        t = time.perf_counter()
        kernel = AsyncKernel(backend=args.backend, mcp=toolset)
        try:
            await kernel.start()
            result = await kernel.execute(
                "tracker.extra_0(1) if hasattr(tracker, 'extra_0') else tracker.add(1, 2)"
            )
            binds.append(time.perf_counter() - t)
            assert result.ok, result.error
            assert len(kernel.registry.functions) == 11 + extra
        finally:
            await kernel.aclose()
    bind = show(f"connected -> first tool call ({11 + extra} tools)", binds)
    print(
        f"{'':<44} binding adds {(bind - boot) * 1000:.2f} ms to a kernel start (target: total <= 200 ms)"
    )

    toolset = Toolset([server])
    async with AsyncKernel(backend=args.backend, mcp=toolset) as kernel:
        connection = toolset._bound["tracker"].connection  # the same connection, direct
        for _ in range(20):
            await kernel.execute("tracker.add(1, 2)")
            await connection.call("add", {"a": 1, "b": 2})
        direct, through, empty = [], [], []
        for _ in range(args.n):
            t = time.perf_counter()
            await connection.call("add", {"a": 1, "b": 2})
            direct.append(time.perf_counter() - t)
            t = time.perf_counter()
            await kernel.execute("tracker.add(1, 2)")
            through.append(time.perf_counter() - t)
            t = time.perf_counter()
            await kernel.execute("1 + 2")
            empty.append(time.perf_counter() - t)
        d = show("direct: ClientSession.call_tool on the host", direct)
        c = show("cell: tracker.add(1, 2) from the kernel", through)
        e = show("cell: 1 + 2 (no call; the cell's own cost)", empty)
        print(
            f"{'':<44} overhead of a call from a cell: {(c - d) * 1000:.2f} ms "
            f"({(c - e - d) * 1000:.2f} ms without the cell itself; target <= 1 ms)"
        )


if __name__ == "__main__":
    asyncio.run(main())
