"""Load on the service: N raw kernels, each executing one cell with one host call per second.

Starts ``sunroom serve`` in a subprocess (subprocess backend by default, a host function
``tick`` loaded with ``--functions``), creates N kernels through ``POST /kernels``, then for T
seconds each client executes ``tick(k)`` once a second through ``POST /kernels/{id}/execute``
and checks the answer. Reports lost results (no or wrong answer), 5xx responses, p50/p99/max
latency of execute, the RSS of the server process (and of its kernels, separately), and the
p50/p99/max latency of ``GET /healthz`` probed 10 times a second meanwhile.

By default the clients are spread over the second; with ``--lockstep`` every client fires at
the same instant each second (a burst of N executes). A 429 with ``Retry-After`` is honoured:
the client waits that long and retries; such an execute is not lost (429s and retries are
counted separately). Execute latency is from the first attempt to the final answer.

    .venv/bin/python benchmarks/service_load.py [--sessions 100] [--seconds 60] [--lockstep]
        [--backend subprocess] [--replicas 3 --db postgresql://... --lease-s 5 --handover 30]

With ``--replicas R`` (R > 1), R servers share the store (``--db``: a SQLite path, or a
``postgresql://`` URL for replicas as they run across hosts), each advertising its own URL.
Kernels are created round-robin over them (placement puts each where it fits) and client i
talks to replica (i + 1) mod R, so most executes are forwarded to the kernel's replica. With 3
replicas or more a hand-over phase follows: ``--handover`` sessions with a scripted model run,
one replica is killed with SIGKILL and another told to stop with SIGTERM, and the time each of
their sessions takes to be resumed elsewhere is reported, against ``--lease-s`` + 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import platform
import secrets
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]

# the server imports this module (``--functions benchmarks.service_load:tick``) with the
# checkout, not benchmarks/, on its path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pg  # noqa: E402
from _server import Server, serve  # noqa: E402


def tick(n: int) -> int:
    """The host function every cell calls: n + 1."""
    return n + 1


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by the process *pid* and by its children."""
    proc = psutil.Process(pid)
    times = proc.cpu_times()
    kids = 0.0
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()
            kids += t.user + t.system
    return times.user + times.system, kids


def rss_mb(pid: int) -> tuple[float, float]:
    proc = psutil.Process(pid)
    own = proc.memory_info().rss
    kids = 0
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            kids += child.memory_info().rss
    return own / 2**20, kids / 2**20


@dataclasses.dataclass
class Stats:
    """What the clients saw."""

    latencies: list[float] = dataclasses.field(default_factory=list)
    calls: int = 0
    lost: int = 0
    errors_5xx: int = 0
    refused_429: int = 0
    refused_429_no_retry_after: int = 0
    retries: int = 0


def _http(url: str, headers: dict[str, str], connections: int) -> httpx.AsyncClient:
    """An HTTP client of *url* with at most *connections* connections, TCP_NODELAY on each.

    TCP_NODELAY: httpx writes a request in pieces; without it Nagle's algorithm and the
    server's delayed ACK add ~40 ms to every request on a reused connection.
    """
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    transport = httpx.AsyncHTTPTransport(
        limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    )
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=60, transport=transport)


@dataclasses.dataclass
class Answer:
    """One HTTP response: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


class RawConnection:
    """One keep-alive HTTP/1.1 connection, written by hand to cost the load generator little.

    httpx spends about 4 ms of CPU per request here; 100 clients firing at once would queue
    behind the generator itself (about 0.4 s a burst on 2 cores) and the figures would measure
    the client. This costs a tenth of that. Only ``Content-Length`` bodies are read (the
    service's JSON answers have one); the connection reopens when the server closes it.
    """

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urllib.parse.urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"Host: {self._host}:{self._port}\r\n{extra}"
        self._io: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> Answer:
        """Send one request and read its answer. Raises OSError, asyncio.IncompleteReadError."""
        if self._io is None:
            reader, writer = await asyncio.open_connection(self._host, self._port)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._io = reader, writer
        reader, writer = self._io
        try:
            kind = "content-type: application/json\r\n" if body else ""
            head = f"{method} {path} HTTP/1.1\r\n{self._head}{kind}"
            writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            data = await reader.readexactly(int(headers.get("content-length", "0")))
        except BaseException:
            await self.aclose()
            raise
        if headers.get("connection", "").lower() == "close":
            await self.aclose()
        return Answer(status, headers, data)

    async def aclose(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._io is not None:
            writer = self._io[1]
            self._io = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def client(
    url: str, headers: dict[str, str], kid: str, start: float, seconds: float, stats: Stats
) -> None:
    """Execute ``tick(k)`` on *kid* at ``start + k`` (monotonic), for k below *seconds*."""
    conn = RawConnection(url, headers)
    try:
        await conn.request("GET", "/healthz")  # the connection is open before the load
        for k in range(math.ceil(seconds)):
            await asyncio.sleep(max(0.0, start + k - time.monotonic()))
            await _execute(conn, kid, k, stats)
    finally:
        await conn.aclose()


async def _execute(conn: RawConnection, kid: str, k: int, stats: Stats) -> None:
    """Execute ``tick(k)``, honouring 429 + Retry-After, and record what happened."""
    t0 = time.perf_counter()
    body = json.dumps({"code": f"tick({k})", "timeout_s": 10}).encode()
    r: Answer | None = None
    while True:
        try:
            r = await conn.request("POST", f"/kernels/{kid}/execute", body)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            r = None
            break
        if r.status != 429:
            break
        wait = r.headers.get("retry-after")
        if wait is None:
            stats.refused_429_no_retry_after += 1
            break
        stats.refused_429 += 1
        stats.retries += 1
        await asyncio.sleep(float(wait))
    stats.calls += 1
    if r is None:
        stats.lost += 1
        return
    stats.latencies.append(time.perf_counter() - t0)
    if r.status >= 500:
        stats.errors_5xx += 1
    if r.status != 200 or json.loads(r.body).get("value") != str(k + 1):
        stats.lost += 1


async def probe_health(url: str, rate: float, start: float, seconds: float) -> list[float]:
    """GET /healthz *rate* times a second from *start* for *seconds*; the latencies (NaN: failed).

    Every probe runs on its own (none waits for another) on an idle kept-alive connection, or
    a new one when all are busy.
    """
    idle: list[RawConnection] = []
    latencies: list[float] = []

    async def one() -> None:
        conn = idle.pop() if idle else RawConnection(url, {})
        t0 = time.perf_counter()
        try:
            r = await conn.request("GET", "/healthz")
        except (OSError, asyncio.IncompleteReadError, ValueError):
            latencies.append(math.nan)
            return
        latencies.append(time.perf_counter() - t0 if r.status == 200 else math.nan)
        idle.append(conn)

    probes = []
    for i in range(int(seconds * rate)):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        probes.append(asyncio.create_task(one()))
    await asyncio.gather(*probes)
    for conn in idle:
        await conn.aclose()
    return latencies


def _probe_process(url: str, rate: float, start: float, seconds: float, out: Connection) -> None:
    """:func:`probe_health` in a process of its own (the clients' loop does not delay it)."""
    out.send(asyncio.run(probe_health(url, rate, start, seconds)))
    out.close()


def _figures(values: list[float]) -> str:
    """p50/p99/max of *values* (seconds) in ms."""
    if not values:
        return "no samples"
    lat = sorted(values)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return (
        f"p50 {statistics.median(lat) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {lat[-1] * 1000:.1f} ms"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _load(args: argparse.Namespace, servers: list[Server]) -> None:
    """The execute load: N raw kernels, each executed once a second (see the module)."""
    urls, headers = [s.url for s in servers], servers[0].headers
    pids = [s.process.pid for s in servers]
    async with contextlib.AsyncExitStack() as stack:
        https = [await stack.enter_async_context(_http(u, headers, 16)) for u in urls]
        t0 = time.monotonic()
        gate = asyncio.Semaphore(8)

        # --direct: kernel i starts on replica i (a request marked forwarded is served where
        # it lands) and its client talks to that replica: no forwarding, the baseline
        local = {"X-Sunroom-Forwarded": "benchmark"} if args.direct else {}

        async def create(i: int) -> str:
            async with gate:
                r = await https[i % len(https)].post("/kernels", json={}, headers=local)
                r.raise_for_status()
                kid: str = r.json()["kernel_id"]
                return kid

        kids = await asyncio.gather(*(create(i) for i in range(args.sessions)))
        print(f"started {len(kids)} kernels ({args.backend}) on {len(urls)} replicas in "
              f"{time.monotonic() - t0:.1f} s")  # fmt: skip
        stats = Stats()
        rss_peak = (0.0, 0.0)

        async def sample() -> None:
            nonlocal rss_peak
            while True:
                own = sum(rss_mb(pid)[0] for pid in pids)
                kernels = sum(rss_mb(pid)[1] for pid in pids)
                rss_peak = (max(rss_peak[0], own), max(rss_peak[1], kernels))
                await asyncio.sleep(1.0)

        def cpu() -> tuple[float, float]:
            both = [cpu_s(pid) for pid in pids]
            return sum(b[0] for b in both), sum(b[1] for b in both)

        sampler = asyncio.create_task(sample())
        cpu0, me0 = cpu(), time.process_time()
        n = len(kids)
        start = time.monotonic() + 2.0  # every client has connected by then
        receiver, sender = multiprocessing.Pipe(duplex=False)
        prober = multiprocessing.get_context("spawn").Process(
            target=_probe_process, args=(urls[0], args.health_rate, start, args.seconds, sender)
        )
        prober.start()
        # client i talks to replica (i + 1) % R: with R > 1 its kernel is usually on another
        # replica, so most executes are forwarded
        await asyncio.gather(
            *(
                client(
                    urls[(i + (0 if args.direct else 1)) % len(urls)], headers, kid,
                    start + (0.0 if args.lockstep else i / n), args.seconds, stats,
                )
                for i, kid in enumerate(kids)
            )
        )  # fmt: skip
        sampler.cancel()
        cpu1, me1 = cpu(), time.process_time()
        probed: list[float] = await asyncio.to_thread(receiver.recv)
        prober.join()
        health = [x for x in probed if not math.isnan(x)]
        health_failed = len(probed) - len(health)
        await asyncio.gather(*(https[0].delete(f"/kernels/{kid}") for kid in kids))
    mode = "lockstep" if args.lockstep else "phased over the second"
    if len(urls) > 1:
        mode += ", each to its kernel's replica" if args.direct else ", most forwarded"
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores ({platform.platform()})")
    print(f"clients {args.sessions} x {args.seconds:.0f} s ({mode}): {stats.calls} executes, "
          f"lost {stats.lost}, 5xx {stats.errors_5xx}, "
          f"429 {stats.refused_429} (with Retry-After; {stats.retries} retries), "
          f"429 without Retry-After {stats.refused_429_no_retry_after}")  # fmt: skip
    print(f"execute latency (first attempt to answer): {_figures(stats.latencies)}")
    print(f"/healthz latency ({len(health)} probes, {health_failed} failed; another process): "
          f"{_figures(health)}")  # fmt: skip
    print(f"CPU during the load: servers {cpu1[0] - cpu0[0]:.1f} s, kernels "
          f"{cpu1[1] - cpu0[1]:.1f} s, this client {me1 - me0:.1f} s")  # fmt: skip
    print(f"servers' RSS peak {rss_peak[0]:.0f} MiB; kernels' RSS peak {rss_peak[1]:.0f} MiB total")


async def _handover(args: argparse.Namespace, servers: list[Server], db: str) -> None:
    """SIGKILL one replica, then SIGTERM another, under running sessions; time the hand-overs.

    A hand-over's time runs from the signal to the ``KernelRestarted`` event the session's new
    replica appends when it resumes it (the event's own timestamp).
    """
    from sunroom.service.config import ServiceConfig

    store = ServiceConfig(db=db).new_store()  # type: ignore[call-arg]
    async with store, _http(servers[0].url, servers[0].headers, 8) as http:
        sids = []
        for i in range(args.handover):
            url = servers[i % len(servers)].url
            r = await http.post(f"{url}/sessions", json={"task": f"run {i}"})
            r.raise_for_status()
            sids.append(r.json()["session_id"])
        await asyncio.sleep(2.0)  # every run is under way
        ids = {r.url: r.replica_id for r in await store.replicas()}

        async def owned_by(server: Server) -> list[str]:
            records = [await store.get_session(sid) for sid in sids]
            return [r.session_id for r in records if r and r.owner == ids[server.url]]

        async def resumed(victims: list[str], since: float) -> list[float]:
            waits: dict[str, float] = {}
            deadline = time.monotonic() + 60
            while len(waits) < len(victims) and time.monotonic() < deadline:
                for sid in victims:
                    if sid in waits:
                        continue
                    for event in await store.events(sid):
                        if event.kind == "KernelRestarted" and event.ts > since:
                            waits[sid] = event.ts - since
                            break
                await asyncio.sleep(0.05)
            for sid in victims:  # say why a session was not resumed
                if sid not in waits:
                    record = await store.get_session(sid)
                    kinds = [e.kind for e in await store.events(sid)][-6:]
                    print(f"  not resumed: {sid[:8]} status={record and record.status} "
                          f"owner={record and record.owner} last events {kinds}")  # fmt: skip
            return sorted(waits.values())

        killed, drained = servers[0], servers[1]
        victims = await owned_by(killed)
        since = time.time()
        killed.process.kill()
        killed.process.wait()
        after_kill = await resumed(victims, since)
        victims_term = await owned_by(drained)
        since = time.time()
        drained.process.terminate()
        code = await asyncio.to_thread(drained.process.wait, 120)
        after_term = await resumed(victims_term, since)

    def line(name: str, waits: list[float], of: int) -> str:
        if not waits:
            return f"{name}: no session was resumed (of {of})"
        return (f"{name}: {len(waits)}/{of} resumed, median {statistics.median(waits):.2f} s, "
                f"max {waits[-1]:.2f} s")  # fmt: skip

    print(f"hand-over ({args.handover} sessions, lease {args.lease_s:g} s, drain grace "
          f"{args.drain_grace_s:g} s):")  # fmt: skip
    print("  " + line("after SIGKILL", after_kill, len(victims))
          + f" (target <= lease + 2 = {args.lease_s + 2:g} s)")  # fmt: skip
    print("  " + line("after SIGTERM (drain)", after_term, len(victims_term))
          + f"; the drained replica exited {code} (target <= 2 s after the grace)")  # fmt: skip


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--backend", default="subprocess")
    ap.add_argument(
        "--lockstep", action="store_true", help="every client fires at the same instant"
    )
    ap.add_argument("--health-rate", type=float, default=10.0, help="/healthz probes a second")
    ap.add_argument(
        "--max-kernel-requests", type=int, default=None, help="the server's admission bound"
    )
    ap.add_argument("--replicas", type=int, default=1, help="servers sharing one store")
    ap.add_argument(
        "--db", default=None,
        help="the store: a SQLite path, a postgresql:// URL, or 'postgres' for a scratch "
        "PostgreSQL cluster started here (fsync on)",
    )  # fmt: skip
    ap.add_argument("--lease-s", type=float, default=5.0, help="the replicas' lease")
    ap.add_argument(
        "--direct", action="store_true",
        help="each client talks to its kernel's replica (no forwarding: the baseline)",
    )  # fmt: skip
    ap.add_argument("--drain-grace-s", type=float, default=0.5, help="the replicas' drain grace")
    ap.add_argument(
        "--handover", type=int, default=30,
        help="sessions in the hand-over phase (3 replicas or more; 0 skips it)",
    )  # fmt: skip
    args = ap.parse_args()
    with contextlib.ExitStack() as scratch:
        db = args.db or str(Path(tempfile.mkdtemp(prefix="sunroom-bench-")) / "s.db")
        if args.db == "postgres":
            bindir = _pg.find_bindir()
            if bindir is None:
                raise SystemExit("no PostgreSQL server binaries here (apt-get install postgresql)")
            pg = scratch.enter_context(_pg.cluster(bindir, fsync=True))
            db = pg.dsn(pg.create_database("bench"), password=True)
        await _run(args, db)


async def _run(args: argparse.Namespace, db: str) -> None:
    """Start the replicas on *db*, put the load on them, then (3 or more) the hand-over."""
    token = secrets.token_urlsafe(24)
    script = Path(tempfile.mkdtemp(prefix="sunroom-bench-")) / "script.json"
    turns = [{"code": "import time\ntime.sleep(0.5)"}] * 60
    script.write_text(json.dumps({"replies": [*turns, "done"], "delay_s": 0.05}))
    # every client connects from 127.0.0.1: lift the per-address connection cap (256) above them
    env = {"SUNROOM_TOKEN": token, "SUNROOM_MODEL": f"scripted:{script}",
           "SUNROOM_MAX_CONNECTIONS_PER_CLIENT": str(max(256, 2 * args.sessions)),
           "SUNROOM_MAX_CONNECTIONS": str(max(1024, 4 * args.sessions))}  # fmt: skip
    base = ["--backend", args.backend, "--functions", "benchmarks.service_load:tick",
            "--max-kernels", str(max(128, args.sessions)),
            *(["--max-kernel-requests", str(args.max_kernel_requests)]
              if args.max_kernel_requests else [])]  # fmt: skip
    with contextlib.ExitStack() as stack:
        servers = []
        for _ in range(args.replicas):
            port = _free_port()
            cluster = ["--advertise-url", f"http://127.0.0.1:{port}", "--lease-s",
                       str(args.lease_s), "--drain-grace-s", str(args.drain_grace_s)]  # fmt: skip
            extra = cluster if args.replicas > 1 else []
            servers.append(stack.enter_context(serve(*base, *extra, env=env, db=db, port=port)))
        print(f"store: {'postgresql' if db.startswith('postgres') else 'sqlite'}; "
              f"{args.replicas} replica(s)")  # fmt: skip
        await _load(args, servers)
        if args.replicas >= 3 and args.handover > 0:
            await _handover(args, servers, db)


if __name__ == "__main__":
    asyncio.run(main())
