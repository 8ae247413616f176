"""Latency of a running cell's output: from the kernel's print to the event that shows it.

A cell prints ``--samples`` lines, each carrying the kernel's wall clock at the print
(``T<i> <time.time()>``; the kernel and this process share the machine's clock), ``--gap``
seconds apart. Each line's latency is the time it reached the reader minus its stamp, over
three paths:

* **session**: an in-process :class:`~sunroom.AsyncSession` subscriber
  (``async for e in session.events()``, the ``OutputChunk`` events);
* **sse**: ``sunroom serve`` in a subprocess and an HTTP client on loopback reading
  ``GET /sessions/{id}/events`` (the event stored, then streamed);
* **run**: ``sunroom run`` in a subprocess, its stdout a pipe, read line by line (what a user
  sees, minus the terminal).

Each path runs twice: lines 200 ms apart (every line is the first of its coalescing window:
published at once) and 20 ms apart (lines inside a window wait for its end, up to 50 ms). Prints
the median, p90 and max per path and gap against the target of issue 28: a cell's first output
line visible in ``sunroom run`` and on SSE within 100 ms (median and p90).

    PYTHONPATH=. .venv/bin/python benchmarks/live_output.py [--samples 40] [--backend bwrap]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _server import serve

from sunroom import AsyncSession
from sunroom.agent import events as ev
from sunroom.providers import AssistantMessage, ScriptedModel, ToolCall

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 100.0
_STAMP = re.compile(r"T(\d+) ([0-9]+\.[0-9]+)")


def cell(samples: int, gap: float) -> str:
    """The cell: *samples* stamped lines, *gap* seconds apart."""
    return (
        "import time\n"
        f"for i in range({samples}):\n"
        "    print(f'T{i} {time.time()!r}', flush=True)\n"
        f"    time.sleep({gap})\n"
    )


def write_script(path: Path, samples: int, gap: float) -> None:
    """A ``scripted:`` model file whose first reply runs :func:`cell`."""
    path.write_text(json.dumps({"replies": [{"code": cell(samples, gap), "text": ""}, "done"]}))


def latencies(text: str, now: float) -> list[float]:
    """Milliseconds from each stamp in *text* to *now*."""
    return [(now - float(m.group(2))) * 1000 for m in _STAMP.finditer(text)]


async def in_process(backend: str, samples: int, gap: float) -> list[float]:
    """Latencies seen by an in-process session subscriber."""
    reply = AssistantMessage([ToolCall("c1", "execute_code", {"code": cell(samples, gap)})])
    async with AsyncSession(model=ScriptedModel([reply, "done"]), backend=backend) as s:
        sub = s.events()
        run = asyncio.create_task(s.run("go"))
        out: list[float] = []
        async for e in sub:
            if isinstance(e, ev.OutputChunk):
                out += latencies(e.text, time.time())
            elif isinstance(e, ev.SessionEnded):
                break
        await run
    return out


async def over_sse(url: str, token: str, samples: int, gap: float, script: Path) -> list[float]:
    """Latencies seen by an SSE client of the server at *url* (its model reads *script*)."""
    write_script(script, samples, gap)
    headers = {"Authorization": f"Bearer {token}"}
    out: list[float] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        r = await http.post("/sessions", json={"task": "go"})  # the server's model: *script*
        r.raise_for_status()
        sid = r.json()["session_id"]
        async with http.stream("GET", f"/sessions/{sid}/events") as resp:
            async for line in resp.aiter_lines():
                now = time.time()
                if line.startswith("data: ") and '"OutputChunk"' in line:
                    out += latencies(json.loads(line[6:])["text"], now)
        await http.delete(f"/sessions/{sid}")
    return out


def through_cli(backend: str, samples: int, gap: float, tmp: Path) -> list[float]:
    """Latencies of the lines ``sunroom run`` prints to a pipe."""
    script = tmp / f"run-{gap}.json"
    write_script(script, samples, gap)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SUNROOM_DB": str(tmp / "run.db")}
    args = [sys.executable, "-m", "sunroom.cli", "run", "go", "--backend", backend,
            "--model", f"scripted:{script}"]  # fmt: skip
    out: list[float] = []
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT) as proc:
        assert proc.stdout is not None
        seen: set[str] = set()
        for line in proc.stdout:
            now = time.time()
            m = _STAMP.search(line)
            if m is not None and m.group(1) not in seen and "print(" not in line:
                seen.add(m.group(1))  # the line printed live; a repeat would be the result's
                out += latencies(line, now)
    return out


def summary(name: str, gap: float, values: list[float]) -> str:
    """One result line: median, p90, max and the verdict against the target."""
    if len(values) < 2:
        return f"{name:8} gap {gap * 1000:4.0f} ms: {len(values)} samples (too few)"
    med = statistics.median(values)
    p90 = statistics.quantiles(values, n=10)[-1]
    verdict = "meets" if med <= TARGET_MS and p90 <= TARGET_MS else "MISSES"
    return (
        f"{name:8} gap {gap * 1000:4.0f} ms: n={len(values):3}  median {med:6.1f} ms  "
        f"p90 {p90:6.1f} ms  max {max(values):6.1f} ms  ({verdict} <= {TARGET_MS:.0f} ms)"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--backend", default="bwrap")
    args = ap.parse_args()
    if args.samples < 30:
        ap.error("--samples must be at least 30")
    tmp = Path(tempfile.mkdtemp(prefix="sunroom-live-"))
    write_script(tmp / "sse.json", args.samples, 0.2)  # the server reads it at start too
    rows: list[str] = []
    server_args = ("--backend", args.backend, "--model", f"scripted:{tmp / 'sse.json'}")
    with serve(*server_args, db=tmp / "s.db") as server:
        url, token = server.url, server.token
        for gap in (0.2, 0.02):
            for name in ("session", "sse", "run"):
                if name == "session":
                    values = await in_process(args.backend, args.samples, gap)
                elif name == "sse":
                    values = await over_sse(url, token, args.samples, gap, tmp / "sse.json")
                else:
                    values = await asyncio.to_thread(
                        through_cli, args.backend, args.samples, gap, tmp
                    )
                rows.append(summary(name, gap, values))
                print(rows[-1], flush=True)
    cpus = os.cpu_count()
    print(f"\n{args.samples} lines per run, backend {args.backend}, {platform.machine()}, "
          f"{cpus} CPUs, Python {platform.python_version()}, {platform.platform()}")  # fmt: skip
    for row in rows:
        print(row)


if __name__ == "__main__":
    asyncio.run(main())
