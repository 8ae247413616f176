"""Relaying the bytes of a CONNECT tunnel, and the idle-timeout supervisor every relay runs under.

After the proxy answers a passthrough CONNECT with 200 it only moves bytes. On Linux it moves
them with ``os.splice`` through a pipe per direction, so the payload never enters Python: the
socket's bytes go into the pipe (:data:`CHUNK` at most), are charged to the :class:`Meter`, and
only then go out of the pipe to the other socket; a chunk the meter refuses stays in the pipe
and never reaches the peer, so a byte budget still cuts exactly. The pipe is emptied before the
next read (it never holds more than one chunk: backpressure is the peer's socket buffer).
Each direction is driven by callbacks of the event loop (``add_reader``/``add_writer``, one at a
time) on duplicated descriptors (their asyncio transports keep the originals, paused).

Where splice is unavailable (not Linux, an ``os`` without ``splice``, or a probe from a Unix
socketpair into a pipe failing with EINVAL, ENOSYS, EPERM or EOPNOTSUPP, e.g. under a seccomp
filter) the stream path is used: ``StreamReader.read`` then ``StreamWriter.write``. Both paths
keep the half-close (a side's EOF is passed on as ``write_eof``), the idle timeout and the byte
counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import os
import socket
from collections.abc import Awaitable
from typing import cast

from sunroom.network.flow import Ended, Flow, Meter

__all__ = ["CHUNK", "hold", "relay_tunnel", "splice_available", "supervise"]

CHUNK = 256 * 1024
"""Bytes read per relay step (and the size asked of each splice pipe)."""
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


@functools.cache
def splice_available() -> bool:
    """Whether ``os.splice`` works here, probed once: a Unix socketpair into a pipe and out."""
    if not hasattr(os, "splice"):
        return False
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        a.sendall(b"x")
        return os.splice(b.fileno(), w, 1) == 1 and os.splice(r, a.fileno(), 1) == 1
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def _transport(writer: asyncio.StreamWriter) -> asyncio.Transport:
    """*writer*'s transport, with its read and write methods.

    Not an isinstance check: uvloop's transports have the same methods without subclassing
    :class:`asyncio.Transport`.
    """
    return cast(asyncio.Transport, writer.transport)


def hold(writer: asyncio.StreamWriter) -> None:
    """Stop ``writer``'s transport reading into its reader if the tunnel will splice its socket."""
    if splice_available():
        _transport(writer).pause_reading()


async def supervise(
    flow: Flow, idle_s: float, mains: list[Awaitable[object]], sides: list[Awaitable[object]]
) -> None:
    """Run ``mains`` and ``sides`` as tasks until every main one ends.

    A connection with no bytes either way for ``idle_s`` (``flow.active`` is the last) ends
    with :class:`Ended` ``("idle timeout")``; a failure of any task ends them all (the caller
    closes the streams).
    """
    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(work) for work in (*mains, *sides)]
    main_tasks = set(tasks[: len(mains)])
    expired = False
    timer: asyncio.TimerHandle | None = None

    def check_idle() -> None:
        nonlocal expired, timer
        if loop.time() >= flow.active + idle_s:
            expired = True
            for task in tasks:
                task.cancel()
        else:
            timer = loop.call_at(flow.active + idle_s, check_idle)

    timer = loop.call_at(flow.active + idle_s, check_idle)
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
) -> None:
    """Relay both ways until both sides have closed (or the idle timeout, or the budget).

    Both writers must have been passed to :func:`hold` when their request (or connection)
    began; with splice, what their readers buffered before is relayed first, by the streams.
    """
    streams = (client, upstream)
    if not splice_available():
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
    for reader, writer in streams:  # what the transports read before they were paused
        reader.feed_eof()
        _transport(writer).set_write_buffer_limits(high=0)
    for (reader, _), (_, writer), outbound in ((client, upstream, True), (upstream, client, False)):
        early = await reader.read()  # at once: the reader has its EOF
        if early:
            meter.count(flow, len(early), outbound=outbound)
            writer.write(early)
    for _, writer in streams:
        await writer.drain()  # with high=0: until nothing is left in the transport
    # the splicers' own futures are supervised: no task per direction
    sending = _Splicer(meter, flow, client[1], upstream[1], outbound=True)
    try:
        receiving = _Splicer(meter, flow, upstream[1], client[1], outbound=False)
    except BaseException:
        sending.close()
        raise
    try:
        await supervise(flow, idle_s, [sending.done, receiving.done], [])
    finally:
        sending.close()
        receiving.close()


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


class _Splicer:
    """One direction of a tunnel, ``source`` -> pipe -> ``sink``, driven by loop callbacks.

    While the pipe is empty it waits for ``source`` to be readable; a chunk read is charged,
    then written out; while ``sink`` cannot take it all, it waits for ``sink`` instead (never
    both). ``done`` ends with None at ``source``'s EOF (after half-closing ``sink``) or with
    the exception that ended it (:class:`Ended` for the budget, OSError).
    """

    def __init__(
        self,
        meter: Meter,
        flow: Flow,
        source: asyncio.StreamWriter,
        sink: asyncio.StreamWriter,
        *,
        outbound: bool,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._meter = meter
        self._flow = flow
        self._sink = sink
        self._outbound = outbound
        self.done: asyncio.Future[None] = self._loop.create_future()
        self._held = 0
        self._src = self._dst = self._r = self._w = -1
        self._reading = self._writing = False
        try:
            self._src = _descriptor(source)
            self._dst = _descriptor(sink)
            self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self.close()
            raise
        with contextlib.suppress(OSError):  # a smaller pipe (the default 64 KiB) also works
            fcntl.fcntl(self._w, fcntl.F_SETPIPE_SZ, CHUNK)
        self._wait(write=False)

    def _wait(self, *, write: bool) -> None:
        if write and not self._writing:
            self._loop.add_writer(self._dst, self._flush)
        elif not write and not self._reading:
            self._loop.add_reader(self._src, self._fill)
        if self._reading and write:
            self._loop.remove_reader(self._src)
        elif self._writing and not write:
            self._loop.remove_writer(self._dst)
        self._reading, self._writing = not write, write

    def _fill(self) -> None:
        try:
            n = os.splice(self._src, self._w, CHUNK, flags=_SPLICE_FLAGS)
            if n:
                self._meter.count(self._flow, n, outbound=self._outbound)
        except BlockingIOError:
            return
        except Exception as exc:  # OSError, Ended, or what ``charge`` raised: the pump's
            self._end(exc)
            return
        if n == 0:
            if self._sink.can_write_eof():
                with contextlib.suppress(OSError):  # the sink may be gone: its own side ends
                    self._sink.write_eof()
            self._end(None)
            return
        self._held = n
        self._flush()

    def _flush(self) -> None:
        try:
            while self._held:
                self._held -= os.splice(self._r, self._dst, self._held, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            self._wait(write=True)
            return
        except OSError as exc:
            self._end(exc)
            return
        self._wait(write=False)

    def _end(self, exc: BaseException | None) -> None:
        self.close()
        if not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)

    def close(self) -> None:
        """Stop waiting and close the duplicated descriptors and the pipe; idempotent."""
        if self._reading:
            self._loop.remove_reader(self._src)
        if self._writing:
            self._loop.remove_writer(self._dst)
        self._reading = self._writing = False
        for fd in (self._r, self._w, self._src, self._dst):
            if fd >= 0:
                os.close(fd)
        self._src = self._dst = self._r = self._w = -1


def _descriptor(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    return os.dup(sock.fileno())  # the transport still owns its fd in the loop's selector
