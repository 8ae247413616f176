"""A burst of session creations against a burst of raw kernel starts, in the same run.

Starts ``sunroom serve`` in a subprocess (subprocess backend by default, the scripted model
``examples/replies.json``, ``--max-sessions`` and a ``--max-kernel-requests`` above the
burst), then, per round, in alternating order:

* **kernels** (the baseline): N concurrent ``POST /kernels``, timed until the last 201, then
  every kernel deleted;
* **sessions**: N concurrent ``POST /sessions`` (no task), timed until the last 201 and,
  separately, until every session's kernel has started (its files route answers: a session
  whose kernel is still starting answers 409), then every session deleted.

Each client has its own connection (httpx, one pool of N). Prints, over ``--rounds`` rounds,
the median time of each burst, the per-request mean, the errors (any non-201) and the ratio of
sessions to kernels (the median of the per-round ratios). The target of issue 26: the session
burst within 1.3x of the kernel burst, 0 errors.

    .venv/bin/python benchmarks/session_burst.py [--n 128] [--rounds 3] [--backend subprocess]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from _server import serve

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Burst:
    """One timed burst: seconds to the last 201, to every kernel up, and the non-201 count."""

    accepted_s: float
    ready_s: float
    errors: int


async def _ready(http: httpx.AsyncClient, sid: str) -> None:
    """Wait until session *sid*'s kernel answers its file listing (it has started).

    The listing waits for a kernel still starting; an older server answers 409 until then.
    """
    while True:
        sent = time.perf_counter()
        try:
            r = await http.get(f"/sessions/{sid}/files", params={"glob": "none"})
        except httpx.TransportError as exc:  # a GET: retried (the creations are never retried)
            waited = time.perf_counter() - sent
            print(f"  session {sid}: files request failed after {waited:.2f} s ({exc!r}); "
                  "retrying", file=sys.stderr)  # fmt: skip
            await asyncio.sleep(0.1)
            continue
        if r.status_code == 200:
            return
        if r.status_code != 409:
            raise RuntimeError(f"session {sid}: files answered {r.status_code}: {r.text}")
        await asyncio.sleep(0.02)


async def burst(url: str, token: str, n: int, kind: str) -> Burst:
    """Create *n* kernels or sessions at once, time it, then delete them.

    Each burst has its own client: *n* fresh connections (none kept from a burst before, which
    the server may be closing as idle just as it is reused).
    """
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=600) as http:
        return await _burst(http, n, kind)


async def _burst(http: httpx.AsyncClient, n: int, kind: str) -> Burst:
    path = "/kernels" if kind == "kernels" else "/sessions"
    key = "kernel_id" if kind == "kernels" else "session_id"
    t0 = time.perf_counter()
    answers = await asyncio.gather(*(http.post(path, json={}) for _ in range(n)))
    accepted = time.perf_counter() - t0
    ids = [r.json()[key] for r in answers if r.status_code == 201]
    errors = n - len(ids)
    for r in answers:
        if r.status_code != 201:
            print(f"  {kind}: {r.status_code} {r.text[:200]}", file=sys.stderr)
    if kind == "sessions":
        await asyncio.gather(*(_ready(http, i) for i in ids))
    ready = time.perf_counter() - t0
    await asyncio.gather(*(http.delete(f"{path}/{i}") for i in ids))
    return Burst(accepted, ready, errors)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="subprocess")
    args = ap.parse_args()
    with serve(
        "--backend", args.backend, "--model", "scripted:examples/replies.json",
        "--max-sessions", str(2 * args.n), "--max-kernel-requests", str(4 * args.n),
    ) as server:  # fmt: skip
        url, token = server.url, server.token
        await burst(url, token, 4, "kernels")  # warm-up: imports, the store, the first kernels
        await burst(url, token, 4, "sessions")
        rows: dict[str, list[Burst]] = {"kernels": [], "sessions": []}
        for k in range(args.rounds):
            order = ["kernels", "sessions"] if k % 2 == 0 else ["sessions", "kernels"]
            for kind in order:
                await asyncio.sleep(1.0)  # the last burst's kernels are gone
                rows[kind].append(b := await burst(url, token, args.n, kind))
                print(f"round {k + 1} {kind:8}: {b.accepted_s:6.2f} s to the last 201, "
                      f"{b.ready_s:6.2f} s to every kernel up, {b.errors} errors")  # fmt: skip
    cpus = os.cpu_count()
    print(f"\n{args.n} concurrent creations, {args.rounds} rounds, backend {args.backend}, "
          f"{platform.machine()}, {cpus} CPUs, Python {platform.python_version()}")  # fmt: skip
    med = {k: statistics.median(b.accepted_s for b in v) for k, v in rows.items()}
    ready = statistics.median(b.ready_s for b in rows["sessions"])
    for kind in ("kernels", "sessions"):
        errors = sum(b.errors for b in rows[kind])
        print(f"{kind:8}: median {med[kind]:.2f} s to the last 201 "
              f"({1000 * med[kind] / args.n:.0f} ms per creation), {errors} errors")  # fmt: skip
    print(f"sessions: median {ready:.2f} s until every kernel is up")
    pairs = list(zip(rows["sessions"], rows["kernels"], strict=True))
    ratios = [s.accepted_s / k.accepted_s for s, k in pairs]
    ready_ratios = [s.ready_s / k.accepted_s for s, k in pairs]
    print(
        f"ratio sessions / kernels: {statistics.median(ratios):.2f}x to the last 201, "
        f"{statistics.median(ready_ratios):.2f}x until every kernel is up (target <= 1.3x)"
    )


if __name__ == "__main__":
    asyncio.run(main())
