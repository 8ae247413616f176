"""Egress proxy benchmarks (issue 17): a proxied HTTPS request against a direct one, same run.

Run: ``.venv/bin/python benchmarks/egress.py [--n 200] [--mb 100] [--rounds 3] [--kernel-rounds 15]``.

Parts, each its own process so that no two share a GIL (as on a real host):

* an HTTPS server on 127.0.0.1 (``http.server``, one request per connection; its CA is made
  by ``sunroom.network.ca.ProxyCA`` and its certificate names the IP 127.0.0.1);
* the egress proxy (``EgressProxy``, passthrough TLS) on a Unix socket, allowing exactly
  ``127.0.0.1:<port>`` with ``allow_addresses=["127.0.0.1/32"]``;
* the kernel's way out (``sunroom.prelude.egress``): a listener on 127.0.0.1 that this process
  binds and hands to the proxy over its Unix socket, as a kernel's supervisor does; the proxy
  accepts on it itself.

The client (this process) uses ``http.client``: direct, and through the handed-over listener
with a CONNECT tunnel (``set_tunnel``). Printed:

* latency: a whole HTTPS request on a fresh connection (TCP, TLS handshake, GET, a 13-byte
  answer), direct and proxied alternating, median and p90 of ``--n`` each, and the added
  median (target: <= 2 ms);
* throughput: a ``--mb`` MB download, median of ``--rounds`` each, MB/s and the ratio proxied /
  direct (target: >= 80%).

The machine's speed is shown by the direct figures themselves (and the load average).

Hooks for another arm (e.g. a client inside a kernel): :func:`latency_arm` takes any callable
that makes one request, :func:`throughput_arm` any callable that downloads and returns the
bytes read; :class:`Rig` gives the server's port, each arm's listener port and the CA file.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import http.server
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MB = 1024 * 1024
_BLOCK = b"x" * MB

# -- the parts, each run as `egress.py --serve-<part> DIR` ------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        size = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/bytes/") else 13
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.send_header("Connection", "close")
        self.end_headers()
        if size == 13:
            self.wfile.write(b"hello, proxy\n")
            return
        left = size
        while left:
            piece = _BLOCK[: min(MB, left)]
            self.wfile.write(piece)
            left -= len(piece)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_upstream(where: Path) -> None:
    from sunroom.network.ca import ProxyCA

    ca = ProxyCA(["127.0.0.1"])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ca.server_context("127.0.0.1")
    context.set_alpn_protocols(["http/1.1"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    (where / "ca.pem").write_bytes(ca.pem)
    (where / "upstream.port").write_text(str(server.server_address[1]))
    server.serve_forever()


def _no_threads() -> None:
    """The streams arm: the proxy as it relays when no relay thread is free (on its loop)."""
    from sunroom.network import relay_threads

    relay_threads.MAX_THREADS = 0


def serve_proxy(where: Path, name: str = "proxy") -> None:
    from sunroom.network import EgressProxy, Network

    if name == "streams":
        _no_threads()
    port = int((where / "upstream.port").read_text())
    network = Network(allow=[f"127.0.0.1:{port}"], allow_addresses=["127.0.0.1/32"])

    async def main() -> None:
        proxy = EgressProxy(network)
        await proxy.start(where / f"{name}.sock", handoff=True)
        (where / f"{name}.ready").write_text("1")
        await asyncio.Event().wait()

    if name == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


async def _floor_pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(256 * 1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _floor_handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    host, port = head.split()[1].decode().rsplit(":", 1)
    up_reader, up_writer = await asyncio.open_connection(host, int(port))
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await asyncio.gather(_floor_pump(reader, up_writer), _floor_pump(up_reader, writer))


def serve_floor(where: Path) -> None:
    """The floor: a bare asyncio CONNECT relay (no parsing, checks or limits), handed a listener."""
    from sunroom.network.handoff import HandoffListener

    async def main() -> None:
        loop = asyncio.get_running_loop()
        servers = []

        def adopt(listener: socket.socket) -> None:
            async def serve() -> None:
                servers.append(await asyncio.start_server(_floor_handle, sock=listener))

            loop.create_task(serve())

        HandoffListener(adopt).start(where / "floor.sock")
        (where / "floor.ready").write_text("1")
        await asyncio.Event().wait()

    asyncio.run(main())


def _listener_for(where: Path, arm: str) -> int:
    """Bind a listener on 127.0.0.1 and hand it to ``arm``'s proxy, as a kernel does; its port."""
    from sunroom.prelude.egress import hand_over, listen

    with listen(0) as listener:
        hand_over(listener, str(where / f"{arm}.sock"))
        port: int = listener.getsockname()[1]
    return port


# -- the rig and the arms ----------------------------------------------------------------------

PARTS = ("upstream", "proxy", "uvloop", "streams", "floor")
"""The processes, in start order: ``--serve-<part> DIR`` runs one."""


def _serve_part(part: str, where: Path) -> None:
    if part == "upstream":
        serve_upstream(where)
    elif part == "floor":
        serve_floor(where)
    else:
        serve_proxy(where, part)


@dataclass
class Rig:
    """The running parts: ports, the CA file, the processes (in :data:`PARTS` order)."""

    where: Path
    upstream_port: int
    ports: dict[str, int]
    ca_file: Path
    processes: list[subprocess.Popen[bytes]]
    socat: subprocess.Popen[bytes] | None = None

    def close(self) -> None:
        for process in [*self.processes, *([self.socat] if self.socat else [])]:
            process.terminate()
            process.wait()


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists() or not path.read_bytes():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path.name} did not appear")
        time.sleep(0.02)


def start_rig() -> Rig:
    where = Path(tempfile.mkdtemp(prefix="sr-egress-"))
    processes = []
    for part in PARTS:
        processes.append(
            subprocess.Popen([sys.executable, __file__, f"--serve-{part}", str(where)])
        )
        _wait_for(where / ("upstream.port" if part == "upstream" else f"{part}.ready"))
    ports = {arm: _listener_for(where, arm) for arm in PARTS[1:]}
    upstream_port = int((where / "upstream.port").read_text())
    socat = _start_socat(upstream_port)
    if socat is not None:
        ports["socat"] = socat[1]
    return Rig(
        where,
        upstream_port,
        ports,
        where / "ca.pem",
        processes,
        socat[0] if socat is not None else None,
    )


def _start_socat(upstream_port: int) -> tuple[subprocess.Popen[bytes], int] | None:
    """The C floor: socat relaying TCP to the server (1 MiB buffers, a process per connection).

    No CONNECT, no checks: the client speaks TLS to socat's port as if it were the server. It
    shows what one more hop costs on this machine whatever the relay is written in. None when
    socat is not installed (``apt-get install socat``).
    """
    socat = shutil.which("socat")
    if socat is None:
        return None
    with (
        socket.socket() as probe
    ):  # a free port (the benchmark's own machine: no race worth guarding)
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    listen = f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"
    process = subprocess.Popen([socat, "-b", str(MB), listen, f"TCP:127.0.0.1:{upstream_port}"])
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, port
        except OSError:
            if time.monotonic() > deadline:
                process.terminate()
                raise RuntimeError("socat did not start listening") from None
            time.sleep(0.02)


def direct_client(rig: Rig) -> Callable[[str], int]:
    context = ssl.create_default_context(cafile=str(rig.ca_file))

    def fetch(path: str) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", rig.upstream_port, context=context)
        return _read(conn, path)

    return fetch


def proxied_client(rig: Rig, arm: str = "proxy") -> Callable[[str], int]:
    """Requests through the listener of ``arm`` (``proxy``, ``uvloop``, ``streams``, ``floor``).

    ``socat``: straight to the relay's port, which leads to the server (no CONNECT).
    """
    context = ssl.create_default_context(cafile=str(rig.ca_file))
    if arm == "socat":
        port = rig.ports[arm]

        def relayed(path: str) -> int:
            return _read(http.client.HTTPSConnection("127.0.0.1", port, context=context), path)

        return relayed
    via = rig.ports[arm]

    def fetch(path: str) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", via, context=context)
        conn.set_tunnel("127.0.0.1", rig.upstream_port)
        return _read(conn, path)

    return fetch


def _read(conn: http.client.HTTPSConnection, path: str) -> int:
    conn.request("GET", path)
    response = conn.getresponse()
    total = 0
    while data := response.read(MB):
        total += len(data)
    conn.close()
    assert response.status == 200, response.status
    return total


def latency_arm(request: Callable[[], object], n: int) -> list[float]:
    """Seconds per call of ``request`` (one whole request each), ``n`` times."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        request()
        times.append(time.perf_counter() - started)
    return times


def throughput_arm(download: Callable[[], int], rounds: int) -> list[float]:
    """MB/s of ``download`` (which returns the bytes it read), ``rounds`` times."""
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        got = download()
        rates.append(got / MB / (time.perf_counter() - started))
    return rates


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


_KERNEL_CLIENT = """
import http.client, json, os, ssl, time
from urllib.parse import urlsplit
_proxy = urlsplit(os.environ["HTTPS_PROXY"])
_context = ssl.create_default_context(cafile=os.path.abspath("ca.pem"))
def _read(conn, path):
    conn.request("GET", path)
    response = conn.getresponse()
    total = 0
    while data := response.read(1 << 20):
        total += len(data)
    conn.close()
    assert response.status == 200, response.status
    return total
def _fetch(path):
    conn = http.client.HTTPSConnection(_proxy.hostname, _proxy.port, context=_context)
    conn.set_tunnel("127.0.0.1", {port})
    return _read(conn, path)
_fetch_loop = _fetch  # the same; the host makes its proxy relay on its loop meanwhile
print(json.dumps(_proxy.port))
"""
_KERNEL_LATENCY = """
_times = []
for _ in range({n}):
    _started = time.perf_counter()
    _fetch("/small")
    _times.append(time.perf_counter() - _started)
print(json.dumps(_times))
"""
_KERNEL_DOWNLOAD = """
_started = time.perf_counter()
_got = {fetch}("{path}")
print(json.dumps(_got / {mb} / (time.perf_counter() - _started)))
"""
_KERNEL_LOCAL_SERVER = """
import pathlib, subprocess, sys
_where = pathlib.Path("local-upstream")
_where.mkdir()
_paths = os.pathsep.join(p for p in sys.path if p)  # the kernel's own, for the server's imports
_server = subprocess.Popen(
    [sys.executable, "egress.py", "--serve-upstream", str(_where)],
    env=dict(os.environ, PYTHONPATH=_paths),
)
_deadline = time.monotonic() + 60
while not (_where / "upstream.port").exists() or not (_where / "upstream.port").read_text():
    assert _server.poll() is None and time.monotonic() < _deadline, "the local server did not start"
    time.sleep(0.05)
_local_port = int((_where / "upstream.port").read_text())
_local_context = ssl.create_default_context(cafile=str(_where / "ca.pem"))
def _fetch_local(path):
    return _read(http.client.HTTPSConnection("127.0.0.1", _local_port, context=_local_context), path)
print(json.dumps(_local_port))
"""


@dataclass
class KernelFigures:
    """What :func:`kernel_arm` measured: seconds per request and MB/s per download."""

    latency: list[float]
    direct_latency: list[float]
    rate: list[float]
    loop_rate: list[float]
    direct_rate: list[float]
    local_rate: list[float]


async def kernel_arm(rig: Rig, n: int, mb: int, rounds: int, blocks: int = 3) -> KernelFigures:
    """A real bwrap kernel with a network policy, its client timed inside its cells.

    The direct arm runs from this process between the kernel's blocks (the kernel's proxy runs
    on this process's egress thread, idle while the direct requests run). Each download round
    runs, in turn: the kernel's download through its proxy (tunnels on relay threads); the same
    with no relay thread free (``loop``: the proxy relays on its event loop, its fallback);
    ``local``, the same download inside the sandbox from the same server run as a process *in*
    the sandbox, on its own 127.0.0.1 (no proxy: the sandbox's own cost, seccomp, its cgroup,
    its loopback); and direct.
    """
    import json

    from sunroom import AsyncKernel, Limits, Network
    from sunroom.network import relay_threads

    network = Network(allow=[f"127.0.0.1:{rig.upstream_port}"], allow_addresses=["127.0.0.1/32"])
    direct = direct_client(rig)
    figures = KernelFigures([], [], [], [], [], [])
    async with AsyncKernel(
        backend="bwrap", network=network, limits=Limits(timeout_s=600, memory_mb=1024)
    ) as kernel:
        await kernel.files.write("ca.pem", rig.ca_file.read_bytes())
        await kernel.files.write("egress.py", await asyncio.to_thread(Path(__file__).read_bytes))

        async def cell(code: str) -> object:
            result = await kernel.execute(code, timeout_s=600)
            if not result.ok:
                raise RuntimeError(f"the kernel arm's cell failed: {result.error}")
            return json.loads(result.stdout.strip().splitlines()[-1])

        await cell(_KERNEL_CLIENT.format(port=rig.upstream_port))
        await cell(_KERNEL_LATENCY.format(n=10))  # warm up
        for _ in range(blocks):  # alternate blocks so that drift hits both arms alike
            got = await cell(_KERNEL_LATENCY.format(n=n // blocks))
            assert isinstance(got, list)
            figures.latency += got
            figures.direct_latency += latency_arm(lambda: direct("/small"), n // blocks)
        path = f"/bytes/{mb * MB}"
        await cell(_KERNEL_LOCAL_SERVER)
        try:
            threads = relay_threads.MAX_THREADS
            for _ in range(rounds):
                for fetch, rates in (
                    ("_fetch", figures.rate),
                    ("_fetch_loop", figures.loop_rate),
                    ("_fetch_local", figures.local_rate),
                ):
                    relay_threads.MAX_THREADS = 0 if fetch == "_fetch_loop" else threads
                    rate = await cell(_KERNEL_DOWNLOAD.format(fetch=fetch, path=path, mb=MB))
                    assert isinstance(rate, float)
                    rates.append(rate)
                relay_threads.MAX_THREADS = threads
                figures.direct_rate += throughput_arm(lambda: direct(path), 1)
        finally:
            await kernel.execute("_server.terminate(); _server.wait()")
    return figures


def _latency_line(name: str, lat: list[float], base: list[float]) -> str:
    ms = 1000
    median, direct = statistics.median(lat), statistics.median(base)
    return (
        f"  {name:<9} median {median * ms:6.2f} ms  p90 {_p90(lat) * ms:6.2f} ms  "
        f"added {(median - direct) * ms:+6.2f} ms  ratio {median / direct:.2f}x"
    )


def _rate_line(name: str, rates: list[float], base: list[float]) -> str:
    median = statistics.median(rates)
    return (
        f"  {name:<9} median {median:6.0f} MB/s  (runs {', '.join(f'{r:.0f}' for r in rates)})"
        f"  {median / statistics.median(base):.0%} of direct"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--kernel-rounds", type=int, default=15, help="download rounds of the in-kernel arm"
    )
    parser.add_argument("--no-kernel", action="store_true", help="skip the in-kernel arm")
    for part in PARTS:
        parser.add_argument(f"--serve-{part}", type=Path)
    args = parser.parse_args()
    for part in PARTS:
        where = getattr(args, f"serve_{part.replace('-', '_')}")
        if where is not None:
            _serve_part(part, where)
            return

    load_before = os.getloadavg()[0]
    rig = start_rig()
    arms = [*PARTS[1:], *(["socat"] if "socat" in rig.ports else [])]
    try:
        direct = direct_client(rig)
        clients = {arm: proxied_client(rig, arm) for arm in arms}
        for fetch in (direct, *clients.values()):  # warm up every path
            for _ in range(10):
                fetch("/small")
        lat: dict[str, list[float]] = {arm: [] for arm in ("direct", *arms)}
        cpu_before = [_cpu_seconds(p.pid) for p in rig.processes]
        for _ in range(args.n):  # alternate so that drift hits every arm alike
            lat["direct"] += latency_arm(lambda: direct("/small"), 1)
            for arm in arms:
                lat[arm] += latency_arm(lambda arm=arm: clients[arm]("/small"), 1)
        cpu = dict(
            zip(
                PARTS,
                [
                    (_cpu_seconds(p.pid) - b) / args.n
                    for p, b in zip(rig.processes, cpu_before, strict=True)
                ],
                strict=True,
            )
        )
        path = f"/bytes/{args.mb * MB}"
        rate: dict[str, list[float]] = {arm: [] for arm in ("direct", *arms)}
        for _ in range(args.rounds):
            rate["direct"] += throughput_arm(lambda: direct(path), 1)
            for arm in arms:
                rate[arm] += throughput_arm(lambda arm=arm: clients[arm](path), 1)
        kernel = None
        if not args.no_kernel:
            kernel = asyncio.run(kernel_arm(rig, args.n, args.mb, args.kernel_rounds))
    finally:
        rig.close()

    ms = 1000
    print(
        f"machine: {os.cpu_count()} cpus, load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    print(
        "arms: proxy = EgressProxy (tunnels on relay threads) accepting on a handed-over listener, "
        "as for a kernel; uvloop = the same on uvloop; streams = the same with no relay thread "
        "free (tunnels relayed on the loop); floor = a bare asyncio CONNECT relay on such a listener; socat = a C relay, one "
        "TCP hop, no CONNECT (the floor of any relay on this machine; absent without socat)"
    )
    print(f"latency (fresh HTTPS request, n={args.n} each, alternating; target: added <= 2 ms):")
    print(
        f"  {'direct':<9} median {statistics.median(lat['direct']) * ms:6.2f} ms  "
        f"p90 {_p90(lat['direct']) * ms:6.2f} ms"
    )
    for arm in arms:
        print(_latency_line(arm, lat[arm], lat["direct"]))
    print(
        "CPU per request (ms): "
        + ", ".join(f"{part} {cpu[part] * ms:.2f}" for part in PARTS if part != "upstream")
    )
    print(f"throughput ({args.mb} MB download, {args.rounds} rounds; target >= 80% of direct):")
    print(f"  {'direct':<9} median {statistics.median(rate['direct']):6.0f} MB/s")
    for arm in arms:
        print(_rate_line(arm, rate[arm], rate["direct"]))
    if kernel is not None:
        k = kernel
        print(
            f"in a bwrap kernel (timed inside its cells; {args.kernel_rounds} download rounds, "
            "each: relay threads, loop relay, local, direct from the host):"
        )
        print(
            _latency_line("kernel", k.latency, k.direct_latency)
            + f"  (direct {statistics.median(k.direct_latency) * ms:.2f} ms)"
        )
        print(
            _rate_line("kernel", k.rate, k.direct_rate)
            + f"  (direct {statistics.median(k.direct_rate):.0f} MB/s)"
        )
        print(
            _rate_line("loop", k.loop_rate, k.direct_rate)
            + "  (the same with no relay thread free: the proxy relays on its loop)"
        )
        print(
            _rate_line("local", k.local_rate, k.direct_rate)
            + "  (the server in the sandbox, no proxy: the sandbox's own cost)"
        )
        paired = [t / loop for t, loop in zip(k.rate, k.loop_rate, strict=True)]
        print(
            f"  relay threads / loop relay, paired by round: median {statistics.median(paired):.2f}x, "
            f"threads faster in {sum(p > 1 for p in paired)} of {len(paired)}"
        )
        print(
            f"  kernel through its proxy / local in the sandbox: "
            f"{statistics.median(k.rate) / statistics.median(k.local_rate):.0%}"
        )


if __name__ == "__main__":
    main()
