"""Relaying the bytes of a CONNECT tunnel, and the idle-timeout supervisor every relay runs under.

After the proxy answers a passthrough CONNECT with 200 it only moves bytes. Each direction runs
on a relay thread of its own (:mod:`~sunroom.network.relay_threads`) that blocks in ``recv`` on
a duplicate of the socket, charges what it read to the :class:`Meter` and only then sends it
on; a chunk the meter refuses is never sent, so a byte budget still cuts exactly. A thread
wakes straight from the socket (no event loop turn per chunk): on this 2-core VM that relays
a 100 MB download at about socat's speed, 5-15 points of direct faster than ``os.splice``
driven by loop callbacks, which this module used before (benchmarks/egress.py, docs/network.md).

The duplicates share their file status with the sockets the transports hold, so those turn
blocking too: the transports must be paused (:func:`hold`), have nothing left to write, and
only be closed afterwards, which :func:`relay_tunnel` and the proxy ensure.

When no relay threads are free (:data:`~sunroom.network.relay_threads.MAX_THREADS` in the
process, :data:`~sunroom.network.relay_threads.PER_SHARE` for one proxy) a tunnel relays on
the event loop instead, with ``StreamReader.read`` then ``StreamWriter.write``. Both
paths keep the half-close (a side's EOF is passed on), the idle timeout and the byte counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Awaitable
from typing import cast

from sunroom.network import relay_threads
from sunroom.network.flow import Ended, Flow, Meter

__all__ = ["CHUNK", "hold", "relay_tunnel", "supervise"]

CHUNK = 256 * 1024
"""Bytes read per relay step (a relay thread's buffer)."""

_buffers = threading.local()


def _transport(writer: asyncio.StreamWriter) -> asyncio.Transport:
    """*writer*'s transport, with its read and write methods.

    Not an isinstance check: uvloop's transports have the same methods without subclassing
    :class:`asyncio.Transport`.
    """
    return cast(asyncio.Transport, writer.transport)


def hold(writer: asyncio.StreamWriter) -> None:
    """Stop ``writer``'s transport reading into its reader: the tunnel will relay its socket."""
    _transport(writer).pause_reading()


async def supervise(
    flow: Flow, idle_s: float, mains: list[Awaitable[object]], sides: list[Awaitable[object]]
) -> None:
    """Run ``mains`` and ``sides`` as tasks until every main one ends.

    A connection with no bytes either way for ``idle_s`` (``flow.active``, monotonic time, is
    the last) ends with :class:`Ended` ``("idle timeout")``; a failure of any task ends them
    all (the caller closes the streams).
    """
    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(work) for work in (*mains, *sides)]
    main_tasks = set(tasks[: len(mains)])
    expired = False
    timer: asyncio.TimerHandle | None = None

    def check_idle() -> None:
        nonlocal expired, timer
        left = flow.active + idle_s - time.monotonic()
        if left <= 0:
            expired = True
            for task in tasks:
                task.cancel()
        else:
            timer = loop.call_later(left, check_idle)

    timer = loop.call_later(idle_s, check_idle)
    try:
        pending = set(tasks)
        while pending & main_tasks:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if expired:
                raise Ended("idle timeout")
            for task in done:
                task.result()  # a failed side task ends the connection too
        flow.finished = True
    finally:
        if timer is not None:
            timer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def relay_tunnel(
    meter: Meter,
    flow: Flow,
    idle_s: float,
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    share: relay_threads.Share | None = None,
) -> None:
    """Relay both ways until both sides have closed (or the idle timeout, or the budget).

    Both writers must have been passed to :func:`hold` when their request (or connection)
    began; what their readers buffered before is relayed first, by the streams. The relay
    threads count against ``share`` (the proxy's). On return (or on an exception) both
    sockets' relay threads have stopped (their last bytes are counted) and closed their
    duplicates; the caller closes the writers.
    """
    streams = (client, upstream)
    pair = _Pair(client[1], upstream[1])
    futures = relay_threads.start(
        [
            lambda: pair.copy(meter, flow, 0, outbound=True),
            lambda: pair.copy(meter, flow, 1, outbound=False),
        ],
        share,
    )
    if futures is None:  # no relay threads free: relay on the loop
        pair.close()
        for _, writer in streams:
            _transport(writer).resume_reading()
        await supervise(
            flow,
            idle_s,
            [
                _pump(meter, flow, client[0], upstream[1], outbound=True),
                _pump(meter, flow, upstream[0], client[1], outbound=False),
            ],
            [],
        )
        return
    # the threads' jobs are never cancelled (shield): each must run to leave the pair, whose
    # last user closes the duplicates; the finally waits for both, so nothing of the tunnel
    # (a thread, a descriptor, a charge) outlives this call
    relays = [asyncio.wrap_future(f) for f in futures]
    try:
        for reader, writer in streams:  # what the transports read before they were paused
            reader.feed_eof()
            _transport(writer).set_write_buffer_limits(high=0)
        for (reader, _), (_, writer), outbound in (
            (client, upstream, True),
            (upstream, client, False),
        ):
            early = await reader.read()  # at once: the reader has its EOF
            if early:
                meter.count(flow, len(early), outbound=outbound)
                writer.write(early)
        for _, writer in streams:
            await writer.drain()  # with high=0: until nothing is left in the transport
        pair.go()
        await supervise(flow, idle_s, [asyncio.shield(relay) for relay in relays], [])
    except Ended as ended:
        flow.reason = flow.reason or ended.reason  # kept if aclose() cuts the wait below
        raise
    finally:
        pair.stop()  # wakes the threads at once: they are blocked in no other way
        await asyncio.shield(asyncio.gather(*relays, return_exceptions=True))


async def _pump(
    meter: Meter,
    flow: Flow,
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    *,
    outbound: bool,
) -> None:
    """Copy until ``source`` ends, then half-close ``sink`` (the stream path)."""
    while data := await source.read(CHUNK):
        meter.count(flow, len(data), outbound=outbound)
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof():
        with contextlib.suppress(OSError):  # the sink may be gone: its own pump ends
            sink.write_eof()


class _Pair:
    """The two sockets of one tunnel as the relay threads see them: blocking duplicates.

    :meth:`copy` runs on a relay thread, one per direction; it waits for :meth:`go` (the
    transports' own bytes are out first). :meth:`stop` shuts both sockets down, which wakes a
    thread blocked in them; the last thread to leave closes the duplicates. Shutting down and
    closing happen under one lock, so a descriptor number is never used after its close.
    """

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._stopped = False
        self._users = 2
        self._socks: list[socket.socket] = []
        try:
            for writer in (client, upstream):
                fd = os.dup(writer.get_extra_info("socket").fileno())
                try:
                    self._socks.append(socket.socket(fileno=fd))
                except OSError:
                    os.close(fd)
                    raise
        except OSError:
            self.close()
            raise

    def go(self) -> None:
        """Let the threads start relaying, with the sockets blocking from now on."""
        for sock in self._socks:
            sock.setblocking(True)
        self._started.set()

    def stop(self) -> None:
        """Make both threads leave soon (idempotent); the sockets take no more bytes."""
        with self._lock:
            self._stopped = True
            for sock in self._socks:
                with contextlib.suppress(OSError):  # already closed by the other side
                    sock.shutdown(socket.SHUT_RDWR)
        self._started.set()

    def close(self) -> None:
        """Close the duplicates now: for a pair whose threads never ran."""
        with self._lock:
            for sock in self._socks:
                sock.close()

    def copy(self, meter: Meter, flow: Flow, source: int, *, outbound: bool) -> None:
        """Relay ``source`` (0: client, 1: upstream) to the other until its EOF or :meth:`stop`.

        Raises :class:`Ended` when the meter refuses a chunk (it is not sent) and OSError when
        a socket fails; at EOF the other side is half-closed.
        """
        try:
            self._started.wait()
            if self._stopped:
                return
            src, dst = self._socks[source], self._socks[1 - source]
            buffer = getattr(_buffers, "chunk", None)
            if buffer is None:
                buffer = _buffers.chunk = bytearray(CHUNK)
            view = memoryview(buffer)
            while n := src.recv_into(buffer):
                meter.count(flow, n, outbound=outbound)
                dst.sendall(view[:n])
                flow.active = time.monotonic()
            with self._lock:
                if not self._stopped:
                    with contextlib.suppress(OSError):  # the peer may be gone: its side ends
                        dst.shutdown(socket.SHUT_WR)
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    for sock in self._socks:
                        sock.close()
