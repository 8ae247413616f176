"""Kernels with a network policy: real kernels (bwrap, docker) reaching loopback servers.

Names such as ``api.test`` are mapped to 127.0.0.1 with ``Network(hosts=...)`` and loopback is
allowed explicitly with ``allow_addresses``: nothing here resolves a real name or touches an
address other than loopback. The servers run on the host; the kernel reaches them only through
its proxy (its own network namespace has nothing but ``lo``).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sunroom import AsyncKernel, Limits, Network
from sunroom.errors import UsageError
from sunroom.network.proxy import Connection
from tests.canary import scan_code
from tests.network.upstream import UpstreamCA

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("no_process_left")]

CANARY = "NETCANARY" + "7d1f0a9c3b5e4d6f8a2c1e0b9d7f5a3c"
LIMITS = Limits(timeout_s=60, memory_mb=512)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append((self.path, dict(self.headers)))
        if self.path == "/hello":
            body = b"hello from api"
        elif self.path == "/auth":  # never echo the credential: say whether it matched
            ok = self.headers.get("Authorization") == f"Bearer {CANARY}"
            body = b"auth-ok" if ok else b"auth-missing"
        elif self.path.startswith("/bytes/"):
            body = b"x" * int(self.path.rsplit("/", 1)[1])
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, dict[str, str]]] = []


@dataclass
class Origin:
    """A loopback HTTP or HTTPS server standing in for ``api.test``."""

    port: int
    server: _Server
    ca: UpstreamCA | None = None
    records: list[Connection] = field(default_factory=list)

    def network(self, **options: Any) -> Network:
        return Network(
            hosts={"api.test": "127.0.0.1", "other.test": "127.0.0.1"},
            allow_addresses=("127.0.0.1",),
            **{"allow": (f"api.test:{self.port}",), **options},
        )


def _serve(server: _Server) -> Iterator[None]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def origin() -> Iterator[Origin]:
    server = _Server()
    it = _serve(server)
    next(it)
    yield Origin(server.server_address[1], server)
    next(it, None)


@pytest.fixture
def tls_origin() -> Iterator[Origin]:
    ca = UpstreamCA("api.test")
    server = _Server()
    server.socket = ca.server("api.test").wrap_socket(server.socket, server_side=True)
    it = _serve(server)
    next(it)
    yield Origin(server.server_address[1], server, ca)
    next(it, None)
    ca.close()


async def value(k: AsyncKernel, code: str, timeout_s: float = 60) -> str:
    r = await k.execute(code, timeout_s=timeout_s)
    assert r.ok, (r.error, r.stdout, r.stderr)
    assert r.value is not None
    return r.value


FETCH = (
    "import urllib.request, urllib.error\n"
    "def fetch(url, **kw):\n"
    "    try:\n"
    "        with urllib.request.urlopen(url, timeout=20, **kw) as r:\n"
    "            return r.status, r.read().decode()\n"
    "    except urllib.error.HTTPError as e:\n"
    "        return e.code, e.read().decode()\n"
    "    except Exception as e:  # refused, reset, or cut short (IncompleteRead)\n"
    "        return type(e).__name__, str(e)\n"
)


async def test_an_allowed_host_answers_and_everything_else_is_refused(
    isolated_backend: str, origin: Origin
) -> None:
    records: list[Connection] = []
    threads: set[int] = set()

    def record(connection: Connection) -> None:  # the proxy runs on the egress thread
        records.append(connection)
        threads.add(threading.get_ident())

    async with AsyncKernel(
        backend=isolated_backend,
        limits=LIMITS,
        network=origin.network(),
        on_connection=record,
    ) as k:
        await value(k, FETCH + "0")
        assert await value(k, f"fetch('http://api.test:{origin.port}/hello')") == (
            "(200, 'hello from api')"
        )
        refused = await value(k, f"fetch('http://other.test:{origin.port}/hello')")
        assert refused.startswith("(403, ") and "allowlist" in refused
        # a raw IP through the proxy, and the same without it (NO_PROXY covers 127.0.0.1)
        proxied_ip = await value(  # straight to the proxy (urllib would bypass it by NO_PROXY)
            k,
            "import socket\n"
            "s = socket.create_connection(('127.0.0.1', 3128), 10)\n"
            f"s.sendall(b'GET http://127.0.0.1:{origin.port}/hello HTTP/1.1\\r\\n"
            f"Host: 127.0.0.1:{origin.port}\\r\\n\\r\\n')\n"
            "s.recv(12).decode()",
        )
        assert proxied_ip == repr("HTTP/1.1 403")
        direct = await value(k, f"fetch('http://127.0.0.1:{origin.port}/hello')")
        assert "ConnectionRefused" in direct or "URLError" in direct
        # an httpx client (requests-style: it takes HTTP_PROXY from the environment)
        assert await value(
            k, f"import httpx\nhttpx.get('http://api.test:{origin.port}/hello').text"
        ) == repr("hello from api")
    allowed = [r for r in records if r.allowed]
    assert {(r.host, r.port) for r in allowed} == {("api.test", origin.port)}
    assert all(r.bytes_received > 0 and r.duration_s >= 0 for r in allowed)
    assert any(not r.allowed and r.host == "other.test" for r in records)
    assert [p for p, _ in origin.server.seen] == ["/hello", "/hello"]  # urllib, httpx
    assert threads == {threading.get_ident()}  # records come back to the caller's loop


async def test_the_sandbox_has_no_way_out_but_the_proxy(
    isolated_backend: str, origin: Origin
) -> None:
    async with AsyncKernel(backend=isolated_backend, limits=LIMITS, network=origin.network()) as k:
        out = await value(
            k,
            "import socket, errno\n"
            "lines = open('/proc/net/dev').read().splitlines()[2:]\n"
            "res = {'interfaces': [line.split(':')[0].strip() for line in lines]}\n"
            "def attempt(name, fn):\n"
            "    try:\n"
            "        fn()\n"
            "        res[name] = 'CONNECTED'\n"
            "    except OSError as e:\n"
            "        res[name] = errno.errorcode.get(e.errno, type(e).__name__)\n"
            f"attempt('host_port', lambda: socket.create_connection(('127.0.0.1', {origin.port}), 2))\n"
            "attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))\n"
            "attempt('ipv6', lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))\n"
            "attempt('raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))\n"
            "attempt('dns', lambda: socket.getaddrinfo('api.test', 80))\n"
            "res",
        )
        res = eval(out)
        assert res["interfaces"] == ["lo"]
        assert res["host_port"] == "ECONNREFUSED"  # the host's loopback is not this one
        assert res["udp"] == res["ipv6"] == res["raw"] == "EAFNOSUPPORT"
        assert res["dns"] != "CONNECTED"  # names resolve on the host only
    assert origin.server.seen == []


async def test_an_injected_credential_works_and_never_reaches_the_kernel(
    isolated_backend: str, origin: Origin
) -> None:
    policy = origin.network(
        inject={f"api.test:{origin.port}": {"Authorization": f"Bearer {CANARY}"}}
    )
    assert CANARY not in repr(policy)
    async with AsyncKernel(backend=isolated_backend, limits=LIMITS, network=policy) as k:
        await value(k, FETCH + "0")
        assert await value(k, f"fetch('http://api.test:{origin.port}/auth')") == "(200, 'auth-ok')"
        result = await k.execute(scan_code(r"NETCANARY[0-9a-f]{32}"))
        assert result.ok, result.error
        assert result.value == "([], True)"
        assert CANARY not in result.stdout + result.stderr
    seen = dict(origin.server.seen)["/auth"]
    assert seen["Authorization"] == f"Bearer {CANARY}"


async def test_https_passes_through_and_terminates_only_to_inject(
    isolated_backend: str, tls_origin: Origin
) -> None:
    assert tls_origin.ca is not None
    url = f"https://api.test:{tls_origin.port}"
    async with AsyncKernel(
        backend=isolated_backend, limits=LIMITS, network=tls_origin.network()
    ) as k:
        await k.files.write("ca.pem", tls_origin.ca.ca.pem)  # passthrough: the kernel
        out = await value(  # verifies the real server itself
            k,
            FETCH + "import ssl\n"
            "ctx = ssl.create_default_context(cafile='ca.pem')\n"
            f"fetch('{url}/hello', context=ctx)",
        )
        assert out == "(200, 'hello from api')"
    policy = tls_origin.network(
        tls="terminate",
        ca_file=str(tls_origin.ca.file),  # the proxy's trust for the upstream
        inject={f"api.test:{tls_origin.port}": {"Authorization": f"Bearer {CANARY}"}},
    )
    async with AsyncKernel(backend=isolated_backend, limits=LIMITS, network=policy) as k:
        # the kernel trusts its proxy's CA through SSL_CERT_FILE: default contexts work
        out = await value(k, FETCH + f"fetch('{url}/auth')")
        assert out == "(200, 'auth-ok')"
        result = await k.execute(scan_code(r"NETCANARY[0-9a-f]{32}"))
        assert result.value == "([], True)"


async def test_injection_over_passthrough_tls_is_refused_with_the_fix(
    isolated_backend: str, tls_origin: Origin
) -> None:
    policy = tls_origin.network(
        inject={f"api.test:{tls_origin.port}": {"Authorization": f"Bearer {CANARY}"}}
    )
    async with AsyncKernel(backend=isolated_backend, limits=LIMITS, network=policy) as k:
        out = await value(k, FETCH + f"fetch('https://api.test:{tls_origin.port}/auth')")
        assert "403" in out
        answer = await value(  # the refusal's sentence, as a client that reads it sees it
            k,
            "import socket\n"
            "s = socket.create_connection(('127.0.0.1', 3128), 10)\n"
            f"s.sendall(b'CONNECT api.test:{tls_origin.port} HTTP/1.1\\r\\n"
            f"Host: api.test:{tls_origin.port}\\r\\n\\r\\n')\n"
            "b''.join(iter(lambda: s.recv(4096), b'')).decode()",
        )
        assert "403 Forbidden" in answer and "use Network(tls=" in answer and "terminate" in answer
        assert CANARY not in answer
    assert tls_origin.server.seen == []


async def test_the_byte_budget_cuts_a_download_and_holds_across_a_restart(
    origin: Origin,
) -> None:
    policy = origin.network(max_bytes=2_000_000)
    async with AsyncKernel(backend="bwrap", limits=LIMITS, network=policy) as k:
        await value(k, FETCH + "0")
        out = await value(k, f"r = fetch('http://api.test:{origin.port}/bytes/500000'); r[0]")
        assert out == "200"
        big = await value(k, f"r = fetch('http://api.test:{origin.port}/bytes/5000000'); r")
        assert "IncompleteRead" in big  # cut before 2 MB had crossed
        assert k.network is not None
        first = k.network.bytes_total
        assert 500_000 < first <= 2_000_000
        await k.restart()
        await value(k, FETCH + "0")
        again = await value(k, f"r = fetch('http://api.test:{origin.port}/bytes/1000000'); r[0]")
        assert again != "200"  # a restart does not refill the budget
        assert first <= k.network.bytes_total <= 2_000_000


async def test_backends_and_kernels_that_cannot_enforce_a_policy_refuse_it() -> None:
    policy = Network(allow=("pypi.org",))
    with pytest.raises(UsageError, match="cannot enforce a network policy"):
        AsyncKernel(backend="subprocess", network=policy)
    with pytest.raises(UsageError, match="must be a sunroom.Network"):
        AsyncKernel(backend="bwrap", network={"allow": ["x"]})  # type: ignore[arg-type]


async def test_a_kernel_without_a_policy_still_has_no_inet_sockets() -> None:
    async with AsyncKernel(backend="bwrap", limits=LIMITS) as k:
        out = await value(
            k,
            "import socket\n"
            "try:\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM); out = 'made'\n"
            "except OSError as e:\n    out = e.errno\n"
            "out",
        )
        assert out == "97"  # EAFNOSUPPORT


async def test_a_jupyter_kernel_in_bwrap_reaches_an_allowed_host_through_its_proxy(
    origin: Origin,
) -> None:
    """The supervisor's exec mode (foreign kernels) hands its listener over as the runtime's."""
    from sunroom import JupyterBackend

    records: list[Connection] = []
    async with AsyncKernel(
        backend=JupyterBackend("python3", sandbox="bwrap"),
        limits=LIMITS,
        network=origin.network(),
        on_connection=records.append,
    ) as k:
        await value(k, FETCH + "0")
        assert await value(k, f"fetch('http://api.test:{origin.port}/hello')") == (
            "(200, 'hello from api')"
        )
        refused = await value(k, f"fetch('http://other.test:{origin.port}/hello')")
        assert refused.startswith("(403, ")
    assert [(r.host, r.allowed) for r in records] == [("api.test", True), ("other.test", False)]


async def test_a_forked_copy_keeps_its_way_out_after_its_parent_closes(origin: Origin) -> None:
    records: list[Connection] = []
    parent = AsyncKernel(
        backend="bwrap", limits=LIMITS, network=origin.network(), on_connection=records.append
    )
    await parent.start()
    try:
        await value(parent, FETCH + "0")
        [copy] = await parent.fork()
    finally:
        await parent.aclose()
    async with copy:
        assert await value(copy, f"fetch('http://api.test:{origin.port}/hello')") == (
            "(200, 'hello from api')"
        )
    assert [(r.host, r.allowed) for r in records] == [("api.test", True)]
