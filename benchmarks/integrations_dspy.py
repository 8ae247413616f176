"""A 10-iteration ``dspy.RLM`` over a 100 MB context: bytes sent to the interpreter, and wall time.

Issue 33's DSPy target: bytes sent to the kernel ≤ 1.05x the context's size. ``dspy.RLM``
passes every input on every iteration; :class:`~sunroom.integrations.dspy.SunroomInterpreter`
binds each content once, DSPy's default ``PythonInterpreter`` (Deno + Pyodide) writes the
value into the code it sends each time. The LM is DSPy's ``DummyLM`` (scripted: ten code
steps, the tenth ``SUBMIT``s), the same for both, so the difference is the interpreter's.

Bytes are counted where they leave the host: every frame written to the sunroom kernel's RPC
socket (``tests/integrations/wire.py``), every line written to Deno's stdin. The default
interpreter runs when a Deno 2.x is found (``--deno PATH``, else ``deno`` on PATH); its runner
imports ``readLines`` from deno.land, so ``--import-map`` may point that URL at a local copy
where deno.land is unreachable (the run then says so).

    PYTHONPATH=. .venv/bin/python benchmarks/integrations_dspy.py [--runs 5] [--mb 100]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dspy
from dspy.primitives.python_interpreter import PythonInterpreter
from dspy.utils.dummies import DummyLM

from sunroom.integrations.dspy import SunroomInterpreter

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 10
TARGET_RATIO = 1.05


def _wire_counter() -> Any:
    spec = importlib.util.spec_from_file_location("wire", ROOT / "tests/integrations/wire.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WireCounter


def context_of(size: int) -> str:
    """*size* ASCII characters of numbered lines, one of them the needle."""
    line = "record {:09d}: nothing to see here, keep scrolling along\n"
    count = size // len(line.format(0)) + 1
    text = "".join(line.format(i) for i in range(count))[:size]
    middle = size // 2
    return text[:middle] + "NEEDLE" + text[middle + 6 :]


def script() -> list[dict[str, str]]:
    """Ten code steps: nine look at a slice of the context, the tenth submits."""
    steps = [
        {
            "reasoning": f"look {i}",
            "code": f"print(len(context), context[{i} * 1000:{i} * 1000 + 30])",
        }
        for i in range(ITERATIONS - 1)
    ]
    steps.append({"reasoning": "found", "code": "SUBMIT(str(context.index('NEEDLE')))"})
    return steps


def run_once(factory: Callable[[], Any], context: str) -> tuple[float, str]:
    """One RLM run; the wall time and the answer."""
    rlm = dspy.RLM("context, query -> answer", max_iters=ITERATIONS, interpreter_factory=factory)
    with dspy.context(lm=DummyLM(script())):
        started = time.perf_counter()
        result = rlm(context=context, query="where is the needle?")
        elapsed = time.perf_counter() - started
    assert len(result.trajectory) == ITERATIONS, result.trajectory[-1]
    return elapsed, str(result.answer)


def sunroom_factory(sent: list[int], backend: str) -> Callable[[], SunroomInterpreter]:
    counter = _wire_counter()
    counters: list[Any] = []

    def factory() -> SunroomInterpreter:
        interpreter = SunroomInterpreter(backend=backend)
        counters.append(counter(interpreter))
        return interpreter

    def total() -> None:
        sent.append(sum(c.sent for c in counters))
        counters.clear()

    factory.total = total  # type: ignore[attr-defined]
    return factory


def deno_factory(sent: list[int], deno: str, import_map: str | None) -> Callable[[], Any]:
    base = PythonInterpreter(deno_command=None).deno_command
    command = [deno, *base[1:]]
    if import_map is not None:
        command.insert(2, f"--import-map={import_map}")
        extra = os.path.dirname(os.path.realpath(import_map))
        command = [c + f",{extra}" if c.startswith("--allow-read=") else c for c in command]
    written: list[int] = []

    def factory() -> PythonInterpreter:
        interpreter = PythonInterpreter(deno_command=command)
        write = interpreter._write_message

        def counting(message: str, context: str) -> None:
            written.append(len(message.encode()) + 1)
            write(message, context)

        interpreter._write_message = counting  # type: ignore[method-assign]
        return interpreter

    def total() -> None:
        sent.append(sum(written))
        written.clear()

    factory.total = total  # type: ignore[attr-defined]
    return factory


def deno_version(deno: str) -> str | None:
    try:
        out = subprocess.run([deno, "--version"], capture_output=True, text=True, timeout=20)
    except OSError:
        return None
    return out.stdout.split("\n", 1)[0] if out.returncode == 0 else None


def report(name: str, times: list[float], sent: list[int], size: int) -> float:
    med = statistics.median(times)
    p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0]
    ratio = statistics.median(sent) / size
    verdict = "meets" if max(sent) <= TARGET_RATIO * size else "MISSES"
    print(
        f"{name:28} n={len(times)}  wall median {med:7.2f} s  p90 {p90:7.2f} s  "
        f"sent {statistics.median(sent) / 1e6:9.1f} MB = {ratio:5.2f}x the context "
        f"({verdict} <= {TARGET_RATIO}x)"
    )
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--deno-runs", type=int, default=1)  # ~15 min a run at 100 MB
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--backend", default="bwrap")
    parser.add_argument("--deno", default=shutil.which("deno"))
    parser.add_argument("--import-map", default=None)
    args = parser.parse_args()

    size = args.mb * 1_000_000
    context = context_of(size)
    expected = str(context.index("NEEDLE"))
    print(
        f"dspy {dspy.__version__}, {ITERATIONS}-iteration RLM over a {args.mb} MB context; "
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
        f"Python {sys.version.split()[0]}"
    )

    sent: list[int] = []
    times: list[float] = []
    factory = sunroom_factory(sent, args.backend)
    for _ in range(args.runs):
        elapsed, answer = run_once(factory, context)
        factory.total()  # type: ignore[attr-defined]
        assert answer == expected, answer
        times.append(elapsed)
    ours = report(f"SunroomInterpreter ({args.backend})", times, sent, size)
    sys.stdout.flush()

    version = deno_version(args.deno) if args.deno else None
    if version is None:
        print("PythonInterpreter (Deno)      not run: no Deno 2.x found (--deno PATH)")
        return
    note = f", readLines from {args.import_map} (deno.land unreachable)" if args.import_map else ""
    print(f"baseline: {version}{note}")
    sent, times = [], []
    factory = deno_factory(sent, args.deno, args.import_map)
    run_once(factory, context_of(2000))  # Pyodide's first load (cache), not timed
    factory.total()  # type: ignore[attr-defined]
    sent.clear()
    for i in range(args.deno_runs):
        elapsed, answer = run_once(factory, context)
        factory.total()  # type: ignore[attr-defined]
        assert answer == expected, answer
        times.append(elapsed)
        print(f"  Deno run {i + 1}: {elapsed:.1f} s, {sent[-1] / 1e6:.1f} MB sent", flush=True)
    theirs = report("PythonInterpreter (Deno)", times, sent, size)
    print(f"wall time: SunroomInterpreter is {theirs / ours:.1f}x faster (medians)")


if __name__ == "__main__":
    main()
