"""The egress proxy's limits, each with its number: connections, head size and time,
connect and idle timeouts, byte budgets; and aclose() with connections open."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from sunroom.errors import UsageError
from sunroom.network import Connection, EgressProxy, Network
from sunroom.network.proxy import MAX_HEAD_BYTES

from .upstream import ask, connect, get, loopback, read_answer, running, tunnel, upstream

pytestmark = pytest.mark.usefixtures("way_in")


async def test_connections_over_max_connections_get_503_at_once() -> None:
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"], max_connections=2)
        async with running(net, on_connection=records.append) as (proxy, sock):
            held = [await tunnel(sock, "api.test", up.port) for _ in range(2)]
            assert all(answer.status == 200 for answer, _, _ in held)
            started = time.monotonic()
            extra = await ask(sock, get("api.test", up.port))
            assert time.monotonic() - started < 1.0
            assert extra.status == 503 and b"2 connections" in extra.body
            for _, _, writer in held:
                writer.close()
            await asyncio.sleep(0.2)
            again = await ask(sock, get("api.test", up.port))
            assert again.status == 200
            assert proxy.connections == 4
    assert [r.reason for r in records].count("too many connections") == 1


async def test_a_head_over_64_kib_is_431() -> None:
    assert MAX_HEAD_BYTES == 65536
    async with running(loopback(allow=["api.test"])) as (_, sock):
        big = get("api.test", 80, extra=f"X-Big: {'a' * 70_000}\r\n")
        answer = await ask(sock, big)
    assert answer.status == 431


async def test_a_slowloris_head_is_cut_off_by_the_head_timeout() -> None:
    records: list[Connection] = []
    net = loopback(allow=["api.test"])
    async with running(net, head_timeout_s=0.5, on_connection=records.append) as (_, sock):
        reader, writer = await connect(sock)
        started = time.monotonic()
        writer.write(b"GET http://api.test/ HTTP/1.1\r\nHost: api")
        for _ in range(3):
            await asyncio.sleep(0.1)
            writer.write(b".")
        answer = await read_answer(reader)
        writer.close()
        assert 0.4 < time.monotonic() - started < 2.0
    assert answer.status == 408
    assert records[0].reason == "head timeout"


async def test_the_connect_timeout_covers_a_slow_resolver() -> None:
    async def slow(host: str) -> list[str]:
        await asyncio.sleep(30)
        return ["127.0.0.1"]

    net = loopback(allow=["slow.test"], connect_timeout_s=0.3)
    async with running(net, resolver=slow) as (_, sock):
        started = time.monotonic()
        answer = await ask(sock, get("slow.test", 80))
    assert answer.status == 504 and b"within 0.3 s" in answer.body
    assert time.monotonic() - started < 2.0


async def test_the_connect_timeout_covers_a_listener_that_never_accepts() -> None:
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = full.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue; later SYNs are dropped
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        await asyncio.sleep(0.1)
        net = loopback("full.test", allow=[f"full.test:{port}"], connect_timeout_s=0.5)
        async with running(net) as (_, sock):
            answer, _, _ = await tunnel(sock, "full.test", port)
    finally:
        for s in fillers:
            s.close()
        full.close()
    assert answer.status == 504


async def test_an_idle_tunnel_and_an_idle_request_are_ended() -> None:
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"], idle_timeout_s=0.4)
        async with running(net, on_connection=records.append) as (_, sock):
            started = time.monotonic()
            answer, reader, writer = await tunnel(sock, "api.test", up.port)
            assert answer.status == 200
            assert await asyncio.wait_for(reader.read(), 3) == b""  # the proxy closed it
            writer.close()
            hang = await asyncio.wait_for(ask(sock, get("api.test", up.port, "/hang")), 3)
            assert time.monotonic() - started < 3.0
    assert hang.status == 0  # closed without an answer
    assert [r.reason for r in records] == ["idle timeout", "idle timeout"]


async def _download(sock, port: int, size: int) -> int:  # type: ignore[no-untyped-def]
    """Bytes received of a plain GET /bytes/size sent through a CONNECT tunnel."""
    answer, reader, writer = await tunnel(sock, "api.test", port)
    if answer.status != 200:
        return -answer.status
    writer.write(f"GET /bytes/{size} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode())
    got = 0
    while data := await reader.read(65536):
        got += len(data)
    writer.close()
    return got


async def test_max_bytes_stops_a_large_transfer_and_refuses_new_connections() -> None:
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"], max_bytes=1_000_000)
        async with running(net, on_connection=records.append) as (proxy, sock):
            got = await _download(sock, up.port, 20_000_000)
            assert 0 < got <= 1_000_000
            assert proxy.bytes_total <= 1_000_000
            assert await _download(sock, up.port, 10) == -429
            plain = await ask(sock, get("api.test", up.port))
            assert plain.status == 429 and b"budget is spent" in plain.body
    # a tunnel is recorded once its relay threads have left: maybe after the next refusal
    (tunnel,) = [r for r in records if r.allowed]
    assert tunnel.bytes_received <= 1_000_000
    assert len(records) == 3 and {r.reason for r in records} == {"byte budget spent"}


async def test_charge_is_called_per_chunk_and_its_false_ends_the_transfer() -> None:
    charged: list[int] = []

    def charge(n: int) -> bool:
        if sum(charged) + n > 500_000:
            return False
        charged.append(n)
        return True

    records: list[Connection] = []
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net, charge=charge, on_connection=records.append) as (proxy, sock):
            got = await _download(sock, up.port, 20_000_000)
            assert proxy.bytes_total == sum(charged)
    assert 0 < got <= 500_000
    assert len(charged) > 2 and records[0].reason == "byte budget spent"
    assert records[0].bytes_sent + records[0].bytes_received == sum(charged)


async def test_aclose_ends_open_connections_and_is_idempotent() -> None:
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net, on_connection=records.append) as (proxy, sock):
            answer, reader, writer = await tunnel(sock, "api.test", up.port)
            assert answer.status == 200
            hanging = asyncio.ensure_future(ask(sock, get("api.test", up.port, "/hang")))
            await asyncio.sleep(0.2)
            await proxy.aclose()
            await proxy.aclose()
            assert await asyncio.wait_for(reader.read(), 2) == b""
            assert (await asyncio.wait_for(hanging, 2)).status == 0
            writer.close()
            assert not sock.exists()
    assert sorted(r.reason or "" for r in records) == ["proxy closed", "proxy closed"]


async def test_a_socket_path_over_107_bytes_is_a_usage_error(tmp_path: Path) -> None:
    proxy = EgressProxy(Network())
    with pytest.raises(UsageError, match="107 bytes"):
        await proxy.start(tmp_path / ("s" * 120))
    await proxy.aclose()
