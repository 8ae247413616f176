"""Data in/out benchmarks. Sections are separate functions selected by flags.

Run: ``.venv/bin/python benchmarks/io.py --inputs [--backend subprocess] [--rounds 5]``.

``--inputs`` (large inputs, docs/data.md "Inputs"): each figure is a median over ``--rounds``
rounds, and is shown with its ratio to a plain ``cp`` of the same bytes measured in the same
run (page cache warm, to a file in the same temp directory):

* bind a 1 GB ``File`` input into a running subprocess kernel, and on a mounting backend the
  extra start time of a kernel with that input mounted (target <= 50 ms: nothing is copied);
* bind a 200 MB ``str`` value into a running kernel (target <= 1.5 s) with the host's peak RSS
  growth during the bind, as a multiple of the value's UTF-8 size (target <= 1.2x);
* bind a list of 1,000,000 short strings (target <= 2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil

from sunroom import AsyncKernel, File, Limits

GB = 1024**3
MB = 1024**2

# -- inputs ----------------------------------------------------------------------------------


def _cp_seconds(src: Path, dst: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    elapsed = time.perf_counter() - started
    dst.unlink()
    return elapsed


class _PeakRss:
    """Samples this process's RSS every 2 ms on a thread; ``peak`` is the highest seen."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)
        return self.peak - self.base


async def inputs_file_bind(path: Path, size: int, backend: str) -> tuple[float, float | None]:
    """Seconds to bind a File input into a running subprocess kernel, and the extra start
    time of a *backend* kernel that mounts it (None when *backend* is subprocess)."""
    async with AsyncKernel(backend="subprocess") as k:
        started = time.perf_counter()
        await k.bind(big=File(path))
        bind_s = time.perf_counter() - started
        r = await k.execute("big.stat().st_size")
        assert r.value == str(size), r
    if backend == "subprocess":
        return bind_s, None
    starts: list[float] = []
    for inputs in ({}, {"big": File(path)}):
        started = time.perf_counter()
        async with AsyncKernel(backend=backend, inputs=inputs) as k:
            starts.append(time.perf_counter() - started)
    return bind_s, starts[1] - starts[0]


async def inputs_str_bind(size: int, backend: str) -> tuple[float, float]:
    """Seconds to bind a *size*-byte str into a running kernel, and peak host RSS growth / size."""
    value = "abcdefghij" * (size // 10)
    limits = Limits(memory_mb=max(2048, 4 * size // MB))
    async with AsyncKernel(backend=backend, limits=limits) as k:
        await k.execute("1")
        rss = _PeakRss()
        started = time.perf_counter()
        await k.bind(text=value)
        elapsed = time.perf_counter() - started
        growth = rss.stop()
        r = await k.execute("len(text)")
        assert r.value == str(len(value)), r
    return elapsed, growth / len(value)


async def inputs_list_bind(n: int, backend: str) -> float:
    """Seconds to bind a list of *n* short strings into a running kernel."""
    value = [f"doc-{i}" for i in range(n)]
    async with AsyncKernel(backend=backend) as k:
        await k.execute("1")
        started = time.perf_counter()
        await k.bind(docs=value)
        elapsed = time.perf_counter() - started
        r = await k.execute("len(docs), docs[-1]")
        assert r.value == repr((n, f"doc-{n - 1}")), r
    return elapsed


def run_inputs(args: argparse.Namespace) -> None:
    """The ``--inputs`` section: prints medians and their ratios to ``cp``."""
    tmp = Path(tempfile.mkdtemp(prefix="sunroom-bench-io-", dir="/tmp"))
    tmp.chmod(0o755)
    try:
        big = tmp / "one-gb.bin"
        with big.open("wb") as f:
            block = os.urandom(MB)
            for _ in range(GB // MB):
                f.write(block)
        big.chmod(0o644)
        str_file = tmp / "str.bin"
        str_file.write_bytes(b"a" * args.str_mb * MB)
        file_s, mount_s, cp_gb, str_s, rss_x, cp_str, list_s = [], [], [], [], [], [], []
        for _ in range(args.rounds):
            cp_gb.append(_cp_seconds(big, tmp / "copy"))
            cp_str.append(_cp_seconds(str_file, tmp / "copy"))
            bind_s, extra = asyncio.run(inputs_file_bind(big, GB, args.backend))
            file_s.append(bind_s)
            if extra is not None:
                mount_s.append(extra)
            s, x = asyncio.run(inputs_str_bind(args.str_mb * MB, args.backend))
            str_s.append(s)
            rss_x.append(x)
            list_s.append(asyncio.run(inputs_list_bind(args.items, args.backend)))
        med = statistics.median
        print(f"inputs ({args.backend}, medians of {args.rounds} rounds)")
        print(f"  cp 1 GB                          {med(cp_gb) * 1e3:8.1f} ms")
        print(
            f"  bind File(1 GB), subprocess      {med(file_s) * 1e3:8.1f} ms"
            f"  ({med(file_s) / med(cp_gb):.4f}x cp; target <= 50 ms)"
        )
        if mount_s:
            print(
                f"  {args.backend} start, extra for mount {med(mount_s) * 1e3:8.1f} ms"
                f"  ({med(mount_s) / med(cp_gb):.4f}x cp; target <= 50 ms)"
            )
        print(f"  cp {args.str_mb} MB                        {med(cp_str) * 1e3:8.1f} ms")
        print(
            f"  bind str({args.str_mb} MB)                {med(str_s) * 1e3:8.1f} ms"
            f"  ({med(str_s) / med(cp_str):.1f}x cp; target <= 1500 ms)"
            f"  host RSS growth {med(rss_x):.2f}x the value (target <= 1.2x)"
        )
        print(
            f"  bind list of {args.items:,} str     {med(list_s) * 1e3:8.1f} ms"
            f"  (target <= 2000 ms)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", action="store_true", help="run the large-inputs section")
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--str-mb", type=int, default=200)
    parser.add_argument("--items", type=int, default=1_000_000)
    args = parser.parse_args()
    if not args.inputs:
        parser.error("choose a section: --inputs")
    if args.inputs:
        run_inputs(args)


if __name__ == "__main__":
    main()
