"""Event append throughput of the store: SQLite against PostgreSQL on this machine, same run.

For each backend and batch size (1 and 10 events per append), per round: a fresh store (a new
SQLite file in a temporary directory; a new database of a scratch PostgreSQL cluster on
127.0.0.1), ``--sessions`` sessions created owned, then every session appends ``--events``
events in batches, the sessions concurrently (one asyncio task each, as a service's sessions
do), timed until the last append returns. Each round runs both backends back to back, in
alternating order. Prints the median events/s and ms per append of each, and the median (and
range) of the rounds' ratios PostgreSQL/SQLite of the time taken: on a shared machine the
disk's and the cores' load drift, and a ratio within one round is steadier than either rate.

Both stores are durable as configured for use: SQLite ``synchronous=FULL``, PostgreSQL with
``fsync=on`` (a commit is on disk when the append returns); ``--no-fsync`` runs the cluster as
the tests do (fsync off). The cluster is ``benchmarks/_pg.py``'s; the events carry an 80-byte
text payload.

    .venv/bin/python benchmarks/store_append.py [--sessions 20] [--events 500] [--rounds 5] [--no-fsync]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _pg import Cluster, cluster, find_bindir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sunroom.store import EventStore, NewEvent, PostgresStore, SQLiteStore  # noqa: E402


async def _run(store: EventStore, sessions: int, events: int, size: int) -> float:
    """Seconds for *sessions* concurrent writers to append *events* each, *size* at a time."""
    async with store:
        for i in range(sessions):
            await store.create_session(f"s{i}", config={}, owner="bench", lease_s=3600)

        async def write(sid: str) -> None:
            for first in range(1, events + 1, size):
                batch = [
                    NewEvent(
                        seq=seq, kind="text", payload={"n": seq, "text": "x" * 80}, ts=time.time()
                    )
                    for seq in range(first, min(first + size, events + 1))
                ]
                await store.append(sid, batch, owner="bench")

        start = time.perf_counter()
        await asyncio.gather(*(write(f"s{i}") for i in range(sessions)))
        elapsed = time.perf_counter() - start
        for i in range(sessions):
            assert await store.last_seq(f"s{i}") == events
        return elapsed


async def _round(pg: Cluster, backend: str, sessions: int, events: int, size: int) -> float:
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="sunroom-bench-")
        try:
            return await _run(SQLiteStore(Path(directory) / "s.db"), sessions, events, size)
        finally:
            shutil.rmtree(directory)
    name = pg.create_database("bench")
    try:
        return await _run(PostgresStore(pg.dsn(name)), sessions, events, size)
    finally:
        pg.drop_database(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-fsync", action="store_true", help="run PostgreSQL with fsync=off")
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries found (pg_config --bindir, PATH)")
    total = args.sessions * args.events
    print(f"{platform.python_version()} on {os.cpu_count()} cores; PostgreSQL from {bindir}"
          f" (fsync {'off' if args.no_fsync else 'on'}, loopback TCP); {args.sessions} sessions"
          f" x {args.events} events, concurrently, {args.rounds} rounds (median)")  # fmt: skip
    with cluster(bindir, fsync=not args.no_fsync) as pg:
        for size in (1, 10):
            times: dict[str, list[float]] = {"sqlite": [], "postgres": []}
            ratios: list[float] = []
            for r in range(args.rounds):
                order = ("sqlite", "postgres") if r % 2 == 0 else ("postgres", "sqlite")
                for backend in order:
                    times[backend].append(
                        asyncio.run(_round(pg, backend, args.sessions, args.events, size))
                    )
                ratios.append(times["postgres"][-1] / times["sqlite"][-1])
            median = {b: statistics.median(t) for b, t in times.items()}
            appends = total / size
            for backend, seconds in median.items():
                print(f"  batch {size:>2}  {backend:<8} {total / seconds:>9,.0f} events/s"
                      f"  {seconds / appends * 1000:6.3f} ms/append  ({seconds:.2f} s)")  # fmt: skip
            print(f"  batch {size:>2}  PostgreSQL/SQLite time: {statistics.median(ratios):.2f}x"
                  f" (median of the rounds' ratios; {min(ratios):.2f}x to {max(ratios):.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
