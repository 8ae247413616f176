"""Data in/out benchmarks. Sections are separate functions selected by flags.

Run: ``.venv/bin/python benchmarks/io.py --inputs|--display [--backend subprocess] [--rounds 5]``.

``--inputs`` (large inputs, docs/data.md "Inputs"): each figure is a median over ``--rounds``
rounds, and is shown with its ratio to a plain ``cp`` of the same bytes measured in the same
run (page cache warm, to a file in the same temp directory):

* bind a 1 GB ``File`` input into a running subprocess kernel, and on a mounting backend the
  extra start time of a kernel with that input mounted (target <= 50 ms: nothing is copied);
* bind a 200 MB ``str`` value into a running kernel (target <= 1.5 s) with the host's peak RSS
  growth during the bind, as a multiple of the value's UTF-8 size (target <= 1.2x);
* bind a list of 1,000,000 short strings (target <= 2 s).

``--display`` (rich display, docs/data.md "Display"): the time a matplotlib figure's PNG adds
after the cell's own code ends (a cell that draws a 640x480 figure and leaves it open, against
the same cell closing it; alternating, the difference of the medians; target <= 50 ms), and a
plain ``x += 1`` cell in a kernel that never imports matplotlib, against the same cell with the
display hooks bypassed in the same kernel (the ratio; target: within the noise). Beside each
figure, two baselines from a **bare** process (the same interpreter, no kernel, matplotlib's
Agg backend): the same drawing code, then ``savefig(format="png")`` (what matplotlib alone
costs), and sunroom's encoder ``sunroom.prelude.display.figure_png`` (what the kernel does,
without the kernel); medians over the same count, alternating, and the kernel's figure as a
ratio to each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
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


# -- display ---------------------------------------------------------------------------------

FIGURES = {
    # matplotlib's default figure: one line on one pair of axes
    "one line": "fig, ax = plt.subplots()\nax.plot([1, 3, 2, 4])\n",
    # a typical chart cell: a labelled line plot and a bar chart side by side
    "line + bars": (
        "fig, (ax1, ax2) = plt.subplots(1, 2)\n"
        "ax1.plot([1, 3, 2, 4], label='sales')\n"
        "ax1.set_title('Sales')\nax1.set_xlabel('month')\nax1.set_ylabel('k$')\nax1.legend()\n"
        "ax2.bar(['north', 'south', 'east', 'west'], [3, 1, 4, 2])\n"
        "ax2.set_title('By region')\nax2.set_ylabel('k$')\n"
    ),
}
# the same cell run with display's per-cell hooks made no-ops (the baseline of their cost)
NO_HOOKS = (
    "from sunroom.prelude import display as _d\n"
    "_d.Outputs.begin = lambda self, cap: None\n"
    "_d.Outputs.end = lambda self: ([], 0)\n"
    "_d.capture_figures = lambda outputs: None\n"
)


async def _timed(k: AsyncKernel, code: str) -> float:
    started = time.perf_counter()
    r = await k.execute(code)
    if not r.ok:
        raise RuntimeError(f"the benchmark cell failed: {r.error}")
    return time.perf_counter() - started


async def display_figure(backend: str, n: int, draw: str) -> tuple[float, float]:
    """Medians (s) of a drawing cell with its figure left open (captured) and closed."""
    async with AsyncKernel(backend=backend, limits=Limits(timeout_s=60)) as k:
        await k.execute("import matplotlib.pyplot as plt\n" + draw + "plt.close('all')")
        await k.execute(draw)  # the first PNG loads fonts
        kept: list[float] = []
        closed: list[float] = []
        for i in range(n):
            order = [(kept, draw), (closed, draw + "plt.close(fig)\n")]
            for samples, code in order if i % 2 == 0 else order[::-1]:
                samples.append(await _timed(k, code))
        r = await k.execute(draw)
        if len(r.outputs) != 1 or "image/png" not in r.outputs[0].data:
            raise RuntimeError("the drawing cell did not return one PNG")
    return statistics.median(kept), statistics.median(closed)


async def display_plain(backend: str, n: int) -> tuple[float, float]:
    """Medians (s) of ``x += 1`` with the display hooks, then in a kernel without them."""
    medians = []
    for bypass in (False, True):
        async with AsyncKernel(backend=backend) as k:
            if bypass:
                await k.execute(NO_HOOKS)
            await k.execute("x = 0")
            for _ in range(50):
                await k.execute("x += 1")
            medians.append(statistics.median([await _timed(k, "x += 1") for _ in range(n)]))
            loaded = await k.execute("import sys\n'matplotlib' in sys.modules")
            if loaded.value != "False":
                raise RuntimeError("a plain kernel imported matplotlib")
    return medians[0], medians[1]


# the bare arm: a plain interpreter with matplotlib's Agg backend; argv[1] is JSON
# {"figures": {name: code}, "n": count}; prints {name: [savefig median s, figure_png median s]}
BARE = """
import io, json, statistics, sys, time
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sunroom.prelude.display import figure_png

def savefig_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()

def timed(draw, encode):
    scope = {"plt": plt}
    exec(draw, scope)
    fig = scope["fig"]
    started = time.perf_counter()
    png = encode(fig)
    elapsed = time.perf_counter() - started
    plt.close(fig)
    assert png.startswith(b"\\x89PNG")
    return elapsed

job = json.loads(sys.argv[1])
out = {}
for name, draw in job["figures"].items():
    timed(draw, savefig_png)  # the first PNG loads fonts
    arms = [(savefig_png, []), (figure_png, [])]
    for i in range(job["n"]):
        for encode, samples in arms if i % 2 == 0 else arms[::-1]:
            samples.append(timed(draw, encode))
    out[name] = [statistics.median(samples) for _, samples in arms]
print(json.dumps(out))
"""


def display_bare(n: int) -> dict[str, list[float]]:
    """Medians (s) of savefig(png) and of figure_png for each figure, in a bare process."""
    env = {**os.environ, "MPLBACKEND": "Agg"}
    job = json.dumps({"figures": FIGURES, "n": n})
    proc = subprocess.run(
        [sys.executable, "-c", BARE, job], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the bare matplotlib process failed: {proc.stderr.strip()[-500:]}")
    out: dict[str, list[float]] = json.loads(proc.stdout)
    return out


def run_display(args: argparse.Namespace) -> None:
    """Print the display figures (medians over the rounds)."""
    capture: dict[str, list[float]] = {name: [] for name in FIGURES}
    savefig: dict[str, list[float]] = {name: [] for name in FIGURES}
    encoder: dict[str, list[float]] = {name: [] for name in FIGURES}
    with_hooks: list[float] = []
    without: list[float] = []
    for _ in range(args.rounds):
        for name, draw in FIGURES.items():
            kept, closed = asyncio.run(display_figure(args.backend, 20, draw))
            capture[name].append(kept - closed)
        for name, (plain, ours) in display_bare(20).items():
            savefig[name].append(plain)
            encoder[name].append(ours)
        hooked, bare = asyncio.run(display_plain(args.backend, 1000))
        with_hooks.append(hooked)
        without.append(bare)
    med = statistics.median
    print(f"display ({args.backend}, {os.cpu_count()} cpus, {args.rounds} rounds):")
    for name, samples in capture.items():
        kernel, plain, ours = med(samples), med(savefig[name]), med(encoder[name])
        print(
            f"  figure PNG after the cell's code, {name:12s} {kernel * 1e3:6.1f} ms"
            "  (target <= 50 ms)"
        )
        print(
            f"    bare process: savefig(png) {plain * 1e3:6.1f} ms ({kernel / plain:.2f}x), "
            f"figure_png {ours * 1e3:6.1f} ms ({kernel / ours:.2f}x)"
        )
    print(
        f"  plain cell x += 1                 {med(with_hooks) * 1e6:8.1f} us, without the "
        f"display hooks {med(without) * 1e6:.1f} us: {med(with_hooks) / med(without):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inputs", action="store_true", help="run the large-inputs section")
    parser.add_argument("--display", action="store_true", help="run the display section")
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--str-mb", type=int, default=200)
    parser.add_argument("--items", type=int, default=1_000_000)
    args = parser.parse_args()
    if not (args.inputs or args.display):
        parser.error("choose a section: --inputs, --display")
    if args.inputs:
        run_inputs(args)
    if args.display:
        run_display(args)


if __name__ == "__main__":
    main()
