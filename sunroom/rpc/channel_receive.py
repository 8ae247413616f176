"""The channel's receive path: bytes from the socket to messages, in order, within bounds.

:class:`ChannelReceiving` is the part of :class:`~sunroom.rpc.channel.Channel` that splits
what the socket delivers into frames, decodes them and hands each message on
(``_dispatch``), and stops reading while it cannot keep up. Frames up to
:data:`INLINE_FRAME` bytes are decoded as they arrive; larger ones are decoded a step at a time
on a task, reading paused meanwhile; frames of :data:`BIG_FRAME` bytes or more are written
straight into an anonymous mapping of their own (the zero-copy path), judged by the early check
and counted as they fill, and the mapping is kept for the next frame of the same size
(:data:`SPARE_FRAME`, :data:`SPARE_IDLE_S`). A frame left half-received past the channel's
deadline while it reads is a violation. Not used alone: the channel owns the socket and the
closing.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Final, final

from sunroom.errors import ProtocolError
from sunroom.rpc import schema
from sunroom.rpc.codec import HEADER, Decoding, WireError, decode
from sunroom.rpc.messages import parse_message

if TYPE_CHECKING:
    from sunroom.rpc.messages import Notification, Request, Response

_log = logging.getLogger(__name__)

INLINE_FRAME: Final = 2048
"""Frames up to this many bytes are decoded as they arrive (at most ~0.5 ms each)."""

BIG_FRAME: Final = 64 * 1024
"""Frames of at least this many bytes are assembled in their own mapping."""

SPARE_FRAME: Final = 4 * 1024 * 1024
"""The mapping of a large frame of at most this many bytes is kept, once decoded, for the next
frame of the same size (a file transfer's chunks are all one size), so it is not mapped,
faulted in and unmapped again for each; it is let go after ``SPARE_IDLE_S`` unused."""

SPARE_IDLE_S: Final = 1.0
"""How long a kept mapping waits for its next frame."""

_Payload = bytes | mmap.mmap

RECEIVE_BUFFER: Final = 256 * 1024
"""Bytes one read of a channel's socket may bring (what asyncio's own transports read)."""

_buffers = threading.local()


def receive_buffer() -> memoryview:
    """The calling thread's receive buffer: every channel whose loop runs there reads into it.

    One read fills it and :meth:`ChannelReceiving._take` consumes it before the next read on
    the thread, so channels can share it: a buffer per thread, not per kernel, and no
    allocation per read.
    """
    view: memoryview | None = getattr(_buffers, "view", None)
    if view is None:
        view = _buffers.view = memoryview(bytearray(RECEIVE_BUFFER))
    return view


_RELEASER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sunroom-release")
"""Unmaps large frames: munmap of a filled 16 MiB mapping takes ~4 ms, off the event loop."""


@final
class _Frame:
    """A frame received (or being received) and its decoding."""

    __slots__ = ("checked", "decoding", "payload")

    def __init__(self, payload: _Payload, decoding: Decoding) -> None:
        self.payload = payload
        self.decoding = decoding
        self.checked = False  # the early check has seen its first bytes


def _release(received: _Frame) -> None:
    """Let go of a frame's bytes; a mapping is unmapped on another thread."""
    received.decoding.close()
    if isinstance(received.payload, mmap.mmap):
        _unmap(received.payload)


def _unmap(mapping: mmap.mmap) -> None:
    _RELEASER.submit(mapping.close).add_done_callback(_released)


def _released(done: Future[None]) -> None:
    if (exc := done.exception()) is not None:
        _log.error("could not unmap a received frame", exc_info=exc)


class ChannelReceiving:
    """The receive path of a :class:`~sunroom.rpc.channel.Channel` (its base; not used alone).

    Reads into the channel's ``_loop``, ``_transport`` and ``closed``; hands each message to
    ``_dispatch`` and each violation to ``_fail``.
    """

    _loop: asyncio.AbstractEventLoop
    _transport: asyncio.Transport | None
    closed: asyncio.Future[None]

    if TYPE_CHECKING:

        def _dispatch(self, msg: Request | Response | Notification) -> None: ...

        def _fail(self, exc: BaseException) -> None: ...

    def _init_receiving(
        self,
        *,
        max_frame: int,
        max_depth: int,
        max_values: int | None,
        early_check: Callable[[bytes], None] | None,
        frame_deadline_s: float,
    ) -> None:
        self._max_frame = max_frame
        self._max_depth = max_depth
        self._max_values = max_values
        self._deadline_s = frame_deadline_s
        self._buf = bytearray()
        self._early_check = early_check
        self._big: _Frame | None = None
        self._big_fill = 0
        self._spare: mmap.mmap | None = None
        self._spare_timer: asyncio.TimerHandle | None = None
        self._catch_up: asyncio.Handle | None = None
        self._backlog: deque[_Frame] = deque()
        self._decoder: asyncio.Task[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._paused: set[str] = set()

    def _take(self, data: memoryview) -> None:
        """Split *data* into frames and hand each complete one on, in order.

        *data* may be the thread's :func:`receive_buffer`, which the next read overwrites:
        whatever is kept is copied out of it before any message is handed on (a handler may
        run a nested loop that reads).
        """
        if not self._buf and self._big is None and len(data) > 4:
            (size,) = HEADER.unpack_from(data)
            if len(data) == 4 + size and size < BIG_FRAME and size <= self._max_frame:
                self._receive(bytes(data[4:]))  # exactly one frame: no buffering
                return
        while data:
            if self._big is not None:
                data = self._fill_big(data)
                continue
            buf = self._buf
            buf += data
            data = memoryview(b"")
            pos = 0
            while len(buf) - pos >= 4:
                (size,) = HEADER.unpack_from(buf, pos)
                if size > self._max_frame:
                    raise WireError(f"frame of {size} bytes exceeds the {self._max_frame}-byte cap")
                if size >= BIG_FRAME:
                    # the rest of what arrived goes straight into the frame's own mapping
                    mapping = self._mapping(size)
                    self._big = _Frame(mapping, self._decoding(mapping))
                    self._big_fill = 0
                    data = memoryview(bytes(buf[pos + 4 :]))
                    pos = len(buf)
                    break
                if len(buf) - pos - 4 < size:
                    break
                payload = bytes(buf[pos + 4 : pos + 4 + size])
                pos += 4 + size
                self._receive(payload)
                if self.closed.done():
                    return
            del buf[:pos]

    def _mapping(self, size: int) -> mmap.mmap:
        """A mapping of *size* bytes for a large frame: the kept one when it fits exactly."""
        spare, self._spare = self._spare, None
        if spare is not None:
            if len(spare) == size:
                return spare
            _unmap(spare)
        return mmap.mmap(-1, size)

    def _release(self, received: _Frame) -> None:
        """Let go of a decoded frame's bytes; keep its mapping for the next frame of its size."""
        payload = received.payload
        if (
            isinstance(payload, mmap.mmap)
            and len(payload) <= SPARE_FRAME
            and self._spare is None
            and not self.closed.done()
        ):
            received.decoding.close()
            self._spare = payload
            if self._spare_timer is not None:
                self._spare_timer.cancel()
            self._spare_timer = self._loop.call_later(SPARE_IDLE_S, self._drop_spare)
            return
        _release(received)

    def _drop_spare(self) -> None:
        self._spare_timer = None
        if self._spare is not None:
            _unmap(self._spare)
            self._spare = None

    def _decoding(self, payload: _Payload) -> Decoding:
        return Decoding(payload, max_depth=self._max_depth, max_values=self._max_values)

    def _fill_big(self, data: memoryview) -> memoryview:
        """Copy what arrived into the large frame being received; judge it as it fills."""
        big = self._big
        assert big is not None
        assert isinstance(big.payload, mmap.mmap)
        size, fill = len(big.payload), self._big_fill
        part = data[: size - fill]
        big.payload[fill : fill + len(part)] = part
        self._big_fill = fill = fill + len(part)
        if not big.checked and fill >= min(size, schema.PREFIX_BYTES):
            big.checked = True
            if self._early_check is not None:
                self._early_check(big.payload[: schema.PREFIX_BYTES])
        if fill == size:
            self._big = None
            self._queue(big)  # counting goes on there, in steps
        elif not big.decoding.count_received(fill):  # a frame over the value cap ends early
            self._pause("counting")  # counting is behind: catch up before reading more
            if self._catch_up is None:
                self._catch_up = self._loop.call_soon(self._count_received)
        return data[len(part) :]

    def _count_received(self) -> None:
        """Count a bounded part of the large frame received so far; again until caught up."""
        self._catch_up = None
        big = self._big
        try:
            if big is None or self.closed.done() or big.decoding.count_received(self._big_fill):
                self._resume("counting")
            else:
                self._catch_up = self._loop.call_soon(self._count_received)
        except WireError as exc:
            self._fail(ProtocolError(str(exc)))

    def _receive(self, payload: bytes) -> None:
        if self._backlog or len(payload) > INLINE_FRAME:
            self._queue(_Frame(payload, self._decoding(payload)))
            return
        message = decode(payload, max_depth=self._max_depth, max_values=self._max_values)
        self._dispatch(parse_message(message))

    def _queue(self, received: _Frame) -> None:
        self._backlog.append(received)
        if self._decoder is None:
            self._pause("decoding")
            self._decoder = self._loop.create_task(self._decode_backlog())

    async def _decode_backlog(self) -> None:
        """Decode the waiting frames in order, a step at a time, then read again."""
        try:
            while self._backlog and not self.closed.done():
                received = self._backlog[0]
                while not received.decoding.step():
                    await asyncio.sleep(0)
                    if self.closed.done():
                        return
                self._backlog.popleft()
                self._release(received)
                self._dispatch(parse_message(received.decoding.value))
        except (WireError, ProtocolError) as exc:
            self._fail(exc if isinstance(exc, ProtocolError) else ProtocolError(str(exc)))
        finally:
            self._decoder = None
            if not self.closed.done():
                self._resume("decoding")

    def _pause(self, reason: str) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused.add(reason)
        self._watch_deadline()

    def _resume(self, reason: str) -> None:
        self._paused.discard(reason)
        if not self._paused and self._transport is not None and not self.closed.done():
            self._transport.resume_reading()
            self._watch_deadline()

    def _watch_deadline(self) -> None:
        """Time a partly received frame, only while the channel is reading."""
        partial = bool(self._buf) or self._big is not None
        if partial and not self._paused and not self.closed.done():
            if self._deadline is None:
                self._deadline = self._loop.call_later(self._deadline_s, self._stalled)
        elif self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _stalled(self) -> None:
        self._deadline = None
        if (self._buf or self._big is not None) and not self._paused:
            self._fail(ProtocolError(f"a frame stayed incomplete for {self._deadline_s} s"))

    def _drop_received(self) -> None:
        """Let go of every frame held, received or kept (the channel is closing)."""
        self._buf.clear()
        if self._big is not None:
            _release(self._big)
            self._big = None
        while self._backlog:
            _release(self._backlog.popleft())
        if self._spare_timer is not None:
            self._spare_timer.cancel()
        self._drop_spare()
