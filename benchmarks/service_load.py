"""Load on the service: N raw kernels, each executing one cell with one host call per second.

Starts ``sunroom serve`` in a subprocess (subprocess backend by default, a host function
``tick`` loaded with ``--functions``), creates N kernels through ``POST /kernels``, then for T
seconds each client executes ``tick(k)`` once a second through ``POST /kernels/{id}/execute``
and checks the answer. Reports lost results (no or wrong answer), 5xx responses, p50/p99
latency of execute, and the RSS of the server process (and of its kernels, separately).

    .venv/bin/python benchmarks/service_load.py [--sessions 100] [--seconds 60] [--backend subprocess]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]


def tick(n: int) -> int:
    """The host function every cell calls: n + 1."""
    return n + 1


def rss_mb(pid: int) -> tuple[float, float]:
    proc = psutil.Process(pid)
    own = proc.memory_info().rss
    kids = 0
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            kids += child.memory_info().rss
    return own / 2**20, kids / 2**20


async def client(
    http: httpx.AsyncClient,
    kid: str,
    seconds: float,
    phase: float,
    stats: dict[str, list[float] | int],
) -> None:
    latencies = stats["latencies"]
    assert isinstance(latencies, list)
    start = time.monotonic() + phase  # clients are spread over the second, not in lockstep
    k = 0
    while time.monotonic() - start < seconds:
        tick_at = start + k
        await asyncio.sleep(max(0.0, tick_at - time.monotonic()))
        t0 = time.perf_counter()
        try:
            r = await http.post(
                f"/kernels/{kid}/execute", json={"code": f"tick({k})", "timeout_s": 10}
            )
        except httpx.HTTPError:
            stats["lost"] = int(stats["lost"]) + 1  # type: ignore[call-overload]
            k += 1
            continue
        latencies.append(time.perf_counter() - t0)
        stats["calls"] = int(stats["calls"]) + 1  # type: ignore[call-overload]
        if r.status_code >= 500:
            stats["5xx"] = int(stats["5xx"]) + 1  # type: ignore[call-overload]
        if r.status_code != 200 or r.json().get("value") != str(k + 1):
            stats["lost"] = int(stats["lost"]) + 1  # type: ignore[call-overload]
        k += 1


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--backend", default="subprocess")
    args = ap.parse_args()
    token = secrets.token_urlsafe(24)
    tmp = Path(tempfile.mkdtemp(prefix="sunroom-load-"))
    env = {**os.environ, "SUNROOM_TOKEN": token, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(  # noqa: ASYNC220 - started once, before the load
        [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0", "--db", str(tmp / "s.db"),
         "--backend", args.backend, "--functions", "benchmarks.service_load:tick"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    url = server.stdout.readline().rsplit(" ", 1)[-1].strip()
    limits = httpx.Limits(
        max_connections=args.sessions + 10, max_keepalive_connections=args.sessions + 10
    )
    headers = {"Authorization": f"Bearer {token}"}
    try:
        # TCP_NODELAY: httpx writes a request in pieces; without it Nagle's algorithm and the
        # server's delayed ACK add ~40 ms to every request on a reused connection
        transport = httpx.AsyncHTTPTransport(
            limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        )
        async with httpx.AsyncClient(
            base_url=url, headers=headers, timeout=60, transport=transport
        ) as http:
            for _ in range(200):
                try:
                    await http.get("/healthz")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            t0 = time.monotonic()
            gate = asyncio.Semaphore(8)

            async def create() -> str:
                async with gate:
                    r = await http.post("/kernels", json={})
                    r.raise_for_status()
                    kid: str = r.json()["kernel_id"]
                    return kid

            kids = await asyncio.gather(*(create() for _ in range(args.sessions)))
            print(f"started {len(kids)} kernels ({args.backend}) in {time.monotonic() - t0:.1f} s")
            stats: dict[str, list[float] | int] = {"latencies": [], "calls": 0, "lost": 0, "5xx": 0}
            rss_peak = (0.0, 0.0)

            async def sample() -> None:
                nonlocal rss_peak
                while True:
                    own, kernels = rss_mb(server.pid)
                    rss_peak = (max(rss_peak[0], own), max(rss_peak[1], kernels))
                    await asyncio.sleep(1.0)

            sampler = asyncio.create_task(sample())
            n = len(kids)
            await asyncio.gather(
                *(client(http, kid, args.seconds, i / n, stats) for i, kid in enumerate(kids))
            )
            sampler.cancel()
            await asyncio.gather(*(http.delete(f"/kernels/{kid}") for kid in kids))
        lat = sorted(stats["latencies"])  # type: ignore[type-var]
        assert isinstance(lat, list)
        p50 = statistics.median(lat) * 1000 if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
        print(f"clients {args.sessions} x {args.seconds:.0f} s: {stats['calls']} executes, "
              f"lost {stats['lost']}, 5xx {stats['5xx']}")  # fmt: skip
        print(f"execute latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms (target p99 <= 250 ms)")
        print(
            f"server RSS peak {rss_peak[0]:.0f} MiB; kernels' RSS peak {rss_peak[1]:.0f} MiB total"
        )
    finally:
        server.terminate()
        server.wait(30)
        server.stdout.close()


if __name__ == "__main__":
    asyncio.run(main())
