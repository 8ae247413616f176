"""smolagents on sunroom: one ``run_code_raise_errors("1+1")`` against its baselines.

Run: ``.venv/bin/python benchmarks/integrations_smolagents.py [--backend bwrap] [--n 300]
[--rounds 5]``.

Series, each ``--n`` calls after a warm-up of ``WARMUP``, in an order that rotates per round:

* ``sunroom execute``: sunroom's own ``Kernel.execute("1+1")`` (the floor), on the very kernel
  the executor wraps, so that the two differ by the adapter alone (two kernels would differ
  by where the scheduler puts their processes on a shared machine, often more than that);
* ``SunroomExecutor``: ``run_code_raise_errors("1+1")`` (target: median <= 1.2x sunroom's
  execute);
* ``LocalPythonExecutor``: smolagents' default, an AST interpreter in the host process (no
  isolation at all): the ratio says what the isolation costs;
* ``DockerExecutor``: smolagents' Docker executor (a Jupyter kernel gateway in a container),
  when Docker and its image (``jupyter-kernel``, built from ``python:3.12-slim`` and PyPI on
  first use) are there; otherwise the reason it was not measured is printed;
* ``... tool``: a cell calling one smolagents tool, ``add(a=1, b=2)``: on the host through a
  sunroom host call for ``SunroomExecutor``, in-process for ``LocalPythonExecutor``.

Figures: per series the median and p90 of the per-round medians and p90s; ratios are medians
of the per-round ratios of medians. The machine (cores, load average) is printed first.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from smolagents import tool
from smolagents.local_python_executor import LocalPythonExecutor
from smolagents.monitoring import AgentLogger, LogLevel

from sunroom.integrations.smolagents import SunroomExecutor

WARMUP = 50
CODE = "1+1"
TOOL_CODE = "add(a=1, b=2)"


def _add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


add = tool(_add)


def _series(call: Callable[[], Any], n: int) -> tuple[float, float]:
    """Median and p90 in ms of *n* calls of *call*, after the warm-up."""
    for _ in range(WARMUP):
        call()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    samples.sort()
    return samples[len(samples) // 2] * 1e3, samples[int(len(samples) * 0.9)] * 1e3


def _docker_executor() -> tuple[Any, str]:
    """smolagents' DockerExecutor, or None and why it could not start."""
    try:
        from smolagents.remote_executors import DockerExecutor

        logger = AgentLogger(LogLevel.OFF, Console(file=io.StringIO()))
        return DockerExecutor([], logger, build_new_image=False), ""
    except Exception as exc:  # reported in the output: the baseline is then absent
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="bwrap")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    print(
        f"smolagents executors, backend {args.backend}: {os.cpu_count()} cores, load average"
        f" {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())};"
        f" {args.rounds} rounds of {args.n} calls of {CODE!r}"
    )
    executor = SunroomExecutor(backend=args.backend)
    kernel = executor.kernel  # the same kernel: the difference is the adapter alone
    executor.send_tools({"add": add})
    local = LocalPythonExecutor([])
    local.send_tools({"add": add})
    docker, why = _docker_executor()

    calls: dict[str, Callable[[], Any]] = {
        "sunroom execute": lambda: kernel.execute(CODE),
        "SunroomExecutor": lambda: executor.run_code_raise_errors(CODE),
        "LocalPythonExecutor": lambda: local(CODE),
        "SunroomExecutor tool": lambda: executor.run_code_raise_errors(TOOL_CODE),
        "LocalPythonExec. tool": lambda: local(TOOL_CODE),
    }
    if docker is not None:
        calls["DockerExecutor"] = lambda: docker.run_code_raise_errors(CODE)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    names = list(calls)
    try:
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                results[name].append(_series(calls[name], args.n))
    finally:
        executor.cleanup()
        if docker is not None:
            docker.delete()

    floor = [p50 for p50, _ in results["sunroom execute"]]
    print(f"{'series':<22}{'p50 ms':>10}{'p90 ms':>10}{'vs execute':>12}")
    for name, rounds in results.items():
        p50 = statistics.median(m for m, _ in rounds)
        p90 = statistics.median(p for _, p in rounds)
        ratio = statistics.median(m / f for (m, _), f in zip(rounds, floor, strict=True))
        print(f"{name:<22}{p50:>10.3f}{p90:>10.3f}{ratio:>11.2f}x")
    ours = [m for m, _ in results["SunroomExecutor"]]
    for name in ("LocalPythonExecutor", "DockerExecutor"):
        if name in results:
            theirs = [m for m, _ in results[name]]
            ratio = statistics.median(o / t for o, t in zip(ours, theirs, strict=True))
            print(f"SunroomExecutor / {name}: {ratio:.2f}x")
    if docker is None:
        print(f"DockerExecutor: not measured ({why})")
    target = statistics.median(o / f for o, f in zip(ours, floor, strict=True))
    print(f"target SunroomExecutor <= 1.2x sunroom execute: {target:.2f}x", end=" ")
    print("(met)" if target <= 1.2 else "(NOT met)")


if __name__ == "__main__":
    main()
