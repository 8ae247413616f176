"""Issue 33's integration benchmarks in one run: smolagents, DSPy, rlm and the E2B facade.

Run: ``.venv/bin/python benchmarks/integrations.py [--only NAME ...] [-- ARGS...]``.

Each part is its own file (``benchmarks/integrations_NAME.py``, whose docstring says what it
measures) and runs here in a subprocess of its own, one after the other, never two at once
(they would measure each other), with this checkout first on ``PYTHONPATH``; its output is
printed as it comes. Nothing runs beside them, so the whole takes what the parts take (each
part's wall time and the total are printed at the end). ``--only`` picks parts (repeatable);
arguments after ``--`` go to the chosen part (one ``--only`` then). Exit status: 0 when every
part exited 0, else 1 (every part still runs).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS = ("smolagents", "dspy", "rlm", "e2b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", action="append", choices=PARTS, help="run this part only")
    parser.add_argument("args", nargs="*", help="after --: arguments for the one chosen part")
    ns = parser.parse_args()
    parts = [p for p in PARTS if p in ns.only] if ns.only else list(PARTS)
    if ns.args and len(parts) != 1:
        parser.error("arguments after -- go to one part: choose it with --only")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    took: list[tuple[str, float, int]] = []
    t0 = time.perf_counter()
    for part in parts:
        print(
            f"=== {part}: benchmarks/integrations_{part}.py {' '.join(ns.args)}".rstrip(),
            flush=True,
        )
        start = time.perf_counter()
        code = subprocess.call(
            [sys.executable, str(HERE / f"integrations_{part}.py"), *ns.args], cwd=ROOT, env=env
        )
        took.append((part, time.perf_counter() - start, code))
        print(flush=True)
    total = time.perf_counter() - t0
    print("=== summary")
    for part, seconds, code in took:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"  {part:10} {seconds:7.1f} s  {status}")
    parts_s = sum(s for _, s, _ in took)
    print(f"  {'total':10} {total:7.1f} s  (the parts: {parts_s:.1f} s)")
    sys.exit(0 if all(code == 0 for _, _, code in took) else 1)


if __name__ == "__main__":
    main()
