"""Egress proxy benchmarks (issue 17): a proxied HTTPS request against a direct one, same run.

Run: ``.venv/bin/python benchmarks/egress.py [--n 200] [--mb 100] [--rounds 3]``.

Parts, each its own process so that no two share a GIL (as on a real host):

* an HTTPS server on 127.0.0.1 (``http.server``, one request per connection; its CA is made
  by ``sunroom.network.ca.ProxyCA`` and its certificate names the IP 127.0.0.1);
* the egress proxy (``EgressProxy``, passthrough TLS) on a Unix socket, allowing exactly
  ``127.0.0.1:<port>`` with ``allow_addresses=["127.0.0.1/32"]``;
* a TCP forwarder with the kernel's shape: it listens on 127.0.0.1 and relays each connection,
  byte for byte, to the proxy's Unix socket with two threads.

The client (this process) uses ``http.client``: direct, and through the forwarder with a
CONNECT tunnel (``set_tunnel``). Printed:

* latency: a whole HTTPS request on a fresh connection (TCP, TLS handshake, GET, a 13-byte
  answer), direct and proxied alternating, median and p90 of ``--n`` each, and the added
  median (target: <= 2 ms);
* throughput: a ``--mb`` MB download, median of ``--rounds`` each, MB/s and the ratio proxied /
  direct (target: >= 80%).

The machine's speed is shown by the direct figures themselves (and the load average).

Hooks for another arm (e.g. a client inside a kernel): :func:`latency_arm` takes any callable
that makes one request, :func:`throughput_arm` any callable that downloads and returns the
bytes read; :class:`Rig` gives the server's port, the forwarder's port and the CA file.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import http.server
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
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


def serve_proxy(where: Path) -> None:
    from sunroom.network import EgressProxy, Network

    port = int((where / "upstream.port").read_text())
    network = Network(allow=[f"127.0.0.1:{port}"], allow_addresses=["127.0.0.1/32"])

    async def main() -> None:
        proxy = EgressProxy(network)
        await proxy.start(where / "proxy.sock")
        (where / "proxy.ready").write_text("1")
        await asyncio.Event().wait()

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
    """The floor: a bare asyncio CONNECT relay (no parsing, checks or limits)."""

    async def main() -> None:
        await asyncio.start_unix_server(_floor_handle, path=str(where / "floor.sock"))
        (where / "floor.ready").write_text("1")
        await asyncio.Event().wait()

    asyncio.run(main())


def _relay(source: socket.socket, sink: socket.socket) -> None:
    """Copy one direction; each thread owns its two descriptors (the sink is a dup)."""
    try:
        while data := source.recv(256 * 1024):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the other side went away: this direction is over
    finally:
        source.close()
        sink.close()


def serve_forwarder(where: Path, name: str = "proxy") -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    (where / f"{name}-forwarder.port").write_text(str(listener.getsockname()[1]))
    path = str(where / f"{name}.sock")
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(path)
        for a, b in ((client, upstream.dup()), (upstream, client.dup())):
            threading.Thread(target=_relay, args=(a, b), daemon=True).start()


# -- the rig and the arms ----------------------------------------------------------------------


@dataclass
class Rig:
    """The running parts: ports, the CA file, the processes."""

    where: Path
    upstream_port: int
    forwarder_port: int
    floor_port: int
    ca_file: Path
    processes: list[subprocess.Popen[bytes]]

    def close(self) -> None:
        for process in self.processes:
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
    for part, ready in (
        ("upstream", "upstream.port"),
        ("proxy", "proxy.ready"),
        ("forwarder", "proxy-forwarder.port"),
        ("floor", "floor.ready"),
        ("floor-forwarder", "floor-forwarder.port"),
    ):
        processes.append(
            subprocess.Popen([sys.executable, __file__, f"--serve-{part}", str(where)])
        )
        _wait_for(where / ready)
    return Rig(
        where,
        int((where / "upstream.port").read_text()),
        int((where / "proxy-forwarder.port").read_text()),
        int((where / "floor-forwarder.port").read_text()),
        where / "ca.pem",
        processes,
    )


def direct_client(rig: Rig) -> Callable[[str], int]:
    context = ssl.create_default_context(cafile=str(rig.ca_file))

    def fetch(path: str) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", rig.upstream_port, context=context)
        return _read(conn, path)

    return fetch


def proxied_client(rig: Rig, port: int | None = None) -> Callable[[str], int]:
    """Requests through a forwarder (default: the egress proxy's; ``rig.floor_port``: the
    bare relay's)."""
    context = ssl.create_default_context(cafile=str(rig.ca_file))
    via = rig.forwarder_port if port is None else port

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parts: dict[str, Callable[[Path], None]] = {
        "upstream": serve_upstream,
        "proxy": serve_proxy,
        "forwarder": serve_forwarder,
        "floor": serve_floor,
        "floor-forwarder": lambda where: serve_forwarder(where, "floor"),
    }
    for part in parts:
        parser.add_argument(f"--serve-{part}", type=Path)
    args = parser.parse_args()
    for part, serve in parts.items():
        where = getattr(args, f"serve_{part.replace('-', '_')}")
        if where is not None:
            serve(where)
            return

    rig = start_rig()
    try:
        direct, proxied = direct_client(rig), proxied_client(rig)
        floor = proxied_client(rig, rig.floor_port)
        for fetch in (direct, proxied, floor):  # warm up every path
            for _ in range(10):
                fetch("/small")
        d_lat: list[float] = []
        p_lat: list[float] = []
        f_lat: list[float] = []
        cpu_before = [_cpu_seconds(p.pid) for p in rig.processes]
        for _ in range(args.n):  # alternate so that drift hits both arms alike
            d_lat += latency_arm(lambda: direct("/small"), 1)
            p_lat += latency_arm(lambda: proxied("/small"), 1)
            f_lat += latency_arm(lambda: floor("/small"), 1)
        cpu_per_request = [
            (_cpu_seconds(p.pid) - before) / args.n
            for p, before in zip(rig.processes, cpu_before, strict=True)
        ]
        path = f"/bytes/{args.mb * MB}"
        d_rate: list[float] = []
        p_rate: list[float] = []
        f_rate: list[float] = []
        for _ in range(args.rounds):
            d_rate += throughput_arm(lambda: direct(path), 1)
            p_rate += throughput_arm(lambda: proxied(path), 1)
            f_rate += throughput_arm(lambda: floor(path), 1)
    finally:
        rig.close()

    ms = 1000
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}")
    print(
        f"latency (fresh HTTPS request, n={args.n}): direct median "
        f"{statistics.median(d_lat) * ms:.2f} ms p90 {_p90(d_lat) * ms:.2f} ms; proxied median "
        f"{statistics.median(p_lat) * ms:.2f} ms p90 {_p90(p_lat) * ms:.2f} ms; added median "
        f"{(statistics.median(p_lat) - statistics.median(d_lat)) * ms:.2f} ms (target <= 2 ms); "
        f"ratio {statistics.median(p_lat) / statistics.median(d_lat):.2f}x"
    )
    _, proxy_cpu, forwarder_cpu, floor_cpu, _ = cpu_per_request
    print(
        f"floor (a bare asyncio CONNECT relay, same forwarder): latency median "
        f"{statistics.median(f_lat) * ms:.2f} ms p90 {_p90(f_lat) * ms:.2f} ms, added median "
        f"{(statistics.median(f_lat) - statistics.median(d_lat)) * ms:.2f} ms; throughput "
        f"{statistics.median(f_rate):.0f} MB/s, "
        f"{statistics.median(f_rate) / statistics.median(d_rate):.0%} of direct; "
        f"CPU per request {floor_cpu * ms:.2f} ms"
    )
    print(
        f"CPU per proxied request (latency loop; the upstream's includes the direct requests): "
        f"proxy {proxy_cpu * ms:.2f} ms, forwarder {forwarder_cpu * ms:.2f} ms"
    )
    print(
        f"throughput ({args.mb} MB download, median of {args.rounds}): direct "
        f"{statistics.median(d_rate):.0f} MB/s; proxied {statistics.median(p_rate):.0f} MB/s; "
        f"{statistics.median(p_rate) / statistics.median(d_rate):.0%} of direct (target >= 80%)"
    )


if __name__ == "__main__":
    main()
