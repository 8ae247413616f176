"""CONNECT tunnels after the 200, on both relay paths: relay threads, and the loop's streams.

A raw TCP server on 127.0.0.1 stands in for the upstream (it speaks first, echoes, or sends a
large body), so the bytes, the half-close, the budget, the records and aclose() are checked
on exactly what the proxy relays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager

import pytest

from sunroom.network import Connection, EgressProxy, relay_threads

from .upstream import loopback, running
from .upstream import tunnel as open_tunnel

pytestmark = pytest.mark.usefixtures("way_in")

BANNER = b"upstream speaks first\n"


@pytest.fixture(params=["threads", "streams"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which relay path the proxy takes (streams: as when no relay thread is free)."""
    if request.param == "streams":
        monkeypatch.setattr(relay_threads, "MAX_THREADS", 0)
    return str(request.param)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send the banner, echo until the client's EOF, then half-close; or send n bytes.

    A proxy that cuts the tunnel (a budget, aclose) may reset this side: that ends it quietly.
    """
    try:
        writer.write(BANNER)
        first = await reader.read(65536)
        if first.startswith(b"SEND "):
            size = int(first.split()[1])
            block = os.urandom(65536)
            while size > 0:
                writer.write(block[: min(size, len(block))])
                size -= len(block)
                await writer.drain()
        else:
            data = first
            while data:
                writer.write(data)
                await writer.drain()
                data = await reader.read(65536)
            writer.write_eof()
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@asynccontextmanager
async def raw_upstream() -> AsyncIterator[int]:
    """An :func:`_echo` server's port; on exit its connections have ended and been closed."""
    handlers: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        await _echo(reader, writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        async with server:
            yield server.sockets[0].getsockname()[1]
    finally:
        await asyncio.wait_for(asyncio.gather(*handlers), 10)


@asynccontextmanager
async def sending(
    size: int, charge: Callable[[int], bool], records: list[Connection]
) -> AsyncIterator[tuple[EgressProxy, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A tunnel through a proxy (``charge``, its records into ``records``) to an
    :func:`_echo` told to send ``size`` bytes."""
    async with raw_upstream() as port:
        net = loopback("api.test", allow=[f"api.test:{port}"])
        async with running(net, charge=charge, on_connection=records.append) as (proxy, sock):
            answer, reader, writer = await open_tunnel(sock, "api.test", port)
            assert answer.status == 200
            writer.write(b"SEND %d" % size)
            yield proxy, reader, writer


async def test_bytes_early_data_and_half_close_pass_exactly(path: str) -> None:
    records: list[Connection] = []
    payload = os.urandom(3 * 1024 * 1024 + 17)
    async with raw_upstream() as port:
        net = loopback("api.test", allow=[f"api.test:{port}"])
        async with running(net, on_connection=records.append) as (proxy, sock):
            answer, reader, writer = await open_tunnel(sock, "api.test", port)
            assert answer.status == 200
            assert await reader.readexactly(len(BANNER)) == BANNER
            writer.write(payload)
            writer.write_eof()  # half-close: the echo still comes back in full
            echoed = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            await asyncio.sleep(0.1)
            assert proxy.bytes_total == len(BANNER) + 2 * len(payload)
    assert echoed == payload
    (record,) = records
    assert record.allowed and record.reason is None
    assert record.bytes_sent == len(payload)
    assert record.bytes_received == len(BANNER) + len(payload)


async def test_a_budget_cuts_the_tunnel_at_exactly_what_was_charged(path: str) -> None:
    records: list[Connection] = []
    charged: list[int] = []

    def charge(n: int) -> bool:
        if sum(charged) + n > 700_000:
            return False
        charged.append(n)
        return True

    async with sending(20_000_000, charge, records) as (
        proxy,
        reader,
        writer,
    ):
        got = len(await asyncio.wait_for(reader.read(), 30))
        writer.close()
        assert proxy.bytes_total == sum(charged)
    (record,) = records
    assert record.reason == "byte budget spent"
    assert got == record.bytes_received <= 700_000  # nothing uncharged reached the client
    assert record.bytes_sent + record.bytes_received == sum(charged)


async def test_aclose_ends_a_busy_tunnel_and_leaves_no_descriptor(path: str) -> None:
    records: list[Connection] = []
    async with raw_upstream() as port:
        net = loopback("api.test", allow=[f"api.test:{port}"])
        async with running(net, on_connection=records.append) as (proxy, sock):
            before = len(os.listdir("/proc/self/fd"))
            answer, reader, writer = await open_tunnel(sock, "api.test", port)
            assert answer.status == 200
            writer.write(b"SEND 1000000000")  # more than the test reads
            await reader.readexactly(1_000_000)
            await proxy.aclose()
            assert await asyncio.wait_for(reader.read(), 10) is not None
            writer.close()
            await asyncio.sleep(0.1)
            # the client's own socket is closed too: nothing of the tunnel is left open
            assert len(os.listdir("/proc/self/fd")) <= before
    assert [r.reason for r in records] == ["proxy closed"]


async def test_tunnels_past_the_proxys_share_of_threads_relay_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay_threads, "PER_SHARE", 2)  # one tunnel's worth
    async with raw_upstream() as port:
        net = loopback("api.test", allow=[f"api.test:{port}"])
        async with running(net) as (proxy, sock):
            tunnels = [await open_tunnel(sock, "api.test", port) for _ in range(3)]
            for answer, reader, _ in tunnels:
                assert answer.status == 200
                assert await reader.readexactly(len(BANNER)) == BANNER
            assert relay_threads.busy() == 2  # the first tunnel's; the others are on the loop
            for i, (_, reader, writer) in enumerate(tunnels):
                payload = os.urandom(300_000 + i)
                writer.write(payload)
                writer.write_eof()
                assert await asyncio.wait_for(reader.read(), 30) == payload
                writer.close()


async def test_aclose_returns_after_the_relay_threads_and_the_record_has_every_charged_byte() -> (
    None
):
    """A relay thread may be mid-chunk (in ``charge``) when aclose() ends its tunnel: aclose()
    returns only after it left, and the record counts the bytes it charged."""
    records: list[Connection] = []
    slow = threading.Event()
    inside = threading.Event()

    def charge(n: int) -> bool:
        if slow.is_set() and not inside.is_set():
            inside.set()
            time.sleep(0.5)  # a slow charge (a caller's bookkeeping) on the relay thread
        return True

    async with sending(1_000_000_000, charge, records) as (
        proxy,
        reader,
        writer,
    ):
        await reader.readexactly(1_000_000)  # of more than the test reads
        assert relay_threads.busy() == 2
        slow.set()
        while not inside.is_set():  # keep the bytes coming until a charge is under way
            await reader.read(65536)
        await proxy.aclose()
        assert relay_threads.busy() == 0  # no thread of the tunnel runs on
        writer.close()
    (record,) = records
    assert record.reason == "proxy closed"
    assert record.bytes_sent + record.bytes_received == proxy.bytes_total


async def test_a_tunnel_ended_before_its_threads_pick_up_their_jobs_closes_its_duplicates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Threads busy elsewhere may take a tunnel's jobs late, after aclose() ended it: the jobs
    still run (they are not cancelled), see the stop, and close the duplicate sockets."""
    release = threading.Event()
    late: list[threading.Thread] = []
    late_work: list[list[Callable[[], object]]] = []

    def late_start(
        work: list[Callable[[], object]], share: relay_threads.Share | None = None
    ) -> list[Future[None]]:
        """A pool whose threads take their jobs only when ``release`` is set."""
        futures: list[Future[None]] = [Future() for _ in work]

        def run(job: Callable[[], object], future: Future[None]) -> None:
            release.wait(10)
            if future.set_running_or_notify_cancel():
                try:
                    job()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(None)

        late_work.append(work)  # held to the end (no collector closes what a job leaves)
        for job, future in zip(work, futures, strict=True):
            late.append(threading.Thread(target=run, args=(job, future), daemon=True))
            late[-1].start()
        return futures

    monkeypatch.setattr(relay_threads, "start", late_start)
    async with raw_upstream() as port:
        net = loopback("api.test", allow=[f"api.test:{port}"])
        async with running(net) as (proxy, sock):
            before = set(os.listdir("/proc/self/fd"))
            answer, _, writer = await open_tunnel(sock, "api.test", port)
            assert answer.status == 200
            await asyncio.sleep(0.1)  # the tunnel waits on its relays now
            tunnel = set(os.listdir("/proc/self/fd")) - before  # its sockets and duplicates
            threading.Timer(0.3, release.set).start()
            await proxy.aclose()
            release.set()
            for thread in late:
                await asyncio.to_thread(thread.join, 10)
            writer.close()
            await asyncio.sleep(0.1)
            assert not tunnel & set(os.listdir("/proc/self/fd"))
