"""The host end of a kernel connection: an asyncio msgpack-RPC peer.

A :class:`Channel` owns one connected stream socket. Both sides may call; many requests may be
in flight; incoming requests are served by an async handler, incoming notifications by a plain
callback. Everything the peer sends is checked before it is used: frames against the codec's
caps (size, values, depth, types; see :mod:`sunroom.rpc.codec`), messages against their
shapes, and the contents against :mod:`sunroom.rpc.schema` (notifications, the params of
requests, the results of the host's own calls). Any violation (undecodable, oversized, too
many values, too deep, badly shaped, a response to an unknown id, a frame left half-sent past
the read deadline) closes the channel with :class:`~sunroom.errors.ProtocolError`; every
pending call then fails with that error and ``on_close`` is told, so the owner can kill the
kernel. The host process itself never crashes.

One peer cannot hold the event loop or the host's memory:

* a frame of more than ``INLINE_FRAME`` bytes is decoded in steps of about
  ``STEP_VALUES`` values, with the loop's other work in between; the channel stops reading
  meanwhile, so messages keep their order and nothing piles up;
* a frame of ``BIG_FRAME`` bytes or more is assembled in its own anonymous mapping, never
  copied, and its memory returns to the system once it is decoded;
* an answer is computed and written only while the peer keeps reading (the transport's write
  buffer is below its high-water mark), and at most ``MAX_INCOMING_REQUESTS`` requests are
  served at once: a peer that stops reading soon stops being read;
* error messages sent to the peer are cut to ``MAX_ERROR_TEXT`` characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, cast, final

from sunroom.errors import ClosedError, ProtocolError
from sunroom.rpc import schema
from sunroom.rpc.codec import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_VALUES,
    HEADER,
    Decoding,
    Framer,
    WireError,
    decode,
)
from sunroom.rpc.eager import start_eagerly
from sunroom.rpc.messages import Notification, Request, Response, RpcError, parse_message
from sunroom.rpc.schema import Checker

_log = logging.getLogger(__name__)

RequestHandler = Callable[[str, Any], Awaitable[Any]]
NotificationHandler = Callable[[str, Any], None]
CloseHandler = Callable[[BaseException | None], None]

MAX_INCOMING_REQUESTS: Final = 256
"""Requests from the peer served at once; beyond this the channel stops reading (backpressure)."""

INLINE_FRAME: Final = 2048
"""Frames up to this many bytes are decoded as they arrive (at most ~0.5 ms each)."""

BIG_FRAME: Final = 64 * 1024
"""Frames of at least this many bytes are assembled in their own mapping."""

MAX_ERROR_TEXT: Final = 1000
"""Longest error message the channel sends to the peer (longer ones are cut)."""

MAX_PENDING_SWEEP: Final = 1024
"""Requests awaiting an answer beyond which the channel forgets those abandoned meanwhile (the
next sweep waits until there are twice as many left as after this one)."""

SPARE_FRAME: Final = 4 * 1024 * 1024
"""The mapping of a large frame of at most this many bytes is kept, once decoded, for the next
frame of the same size (a file transfer's chunks are all one size), so it is not mapped,
faulted in and unmapped again for each; it is let go after ``SPARE_IDLE_S`` unused."""

SPARE_IDLE_S: Final = 1.0
"""How long a kept mapping waits for its next frame."""

SEND_BUFFER: Final = 512 * 1024
"""``SO_SNDBUF`` of the socket (Linux doubles it for its bookkeeping): a 1 MiB file chunk mostly
goes straight into the socket instead of through the transport's buffer (a copy), while a
peer that stops reading still gets only a couple of answers computed before the channel waits."""

_Payload = bytes | mmap.mmap

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


class RemoteError(Exception):
    """The peer answered a call with an error map; ``error`` holds it."""

    def __init__(self, error: RpcError) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.error = error


class RpcFailure(Exception):
    """Raise from a request handler to answer with exactly this error map."""

    def __init__(self, error: RpcError) -> None:
        super().__init__(error.message)
        self.error = error


def cut(text: str, longest: int = MAX_ERROR_TEXT) -> str:
    """*text* itself, or its first *longest* characters and how many were left out."""
    if len(text) <= longest:
        return text
    return f"{text[:longest]}... ({len(text) - longest} more characters)"


@final
class Channel(asyncio.Protocol):
    """Async msgpack-RPC endpoint. Build with :meth:`open`; close with :meth:`aclose`.

    Args:
        handler: serves the peer's requests (see :meth:`serve_with`).
        on_notification: called with (method, checked params) for each notification.
        on_close: called once with the reason (None for a clean close) when the channel closes.
        max_frame / max_depth / max_values: the codec's caps for frames from the peer
            (``max_values=None``: no cap on values).
        notifications: the checker of each notification the peer may send; any other is a
            violation. None accepts every notification unchecked.
        requests: the checker of the params of requests the peer may send, by method; the
            params of other methods reach the handler unchecked. None checks none.
        early_check: judges the first ``schema.PREFIX_BYTES`` of a large frame as soon as they
            arrive (raises WireError to refuse it); None for no such check.
        frame_deadline_s: how long a frame that has started may take to arrive.

    The defaults are those of a kernel peer (:mod:`sunroom.rpc.schema`).
    """

    def __init__(
        self,
        *,
        handler: RequestHandler | None = None,
        on_notification: NotificationHandler | None = None,
        on_close: CloseHandler | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_values: int | None = DEFAULT_MAX_VALUES,
        notifications: Mapping[str, Checker] | None = schema.NOTIFICATIONS,
        requests: Mapping[str, Checker] | None = schema.REQUESTS,
        early_check: Callable[[bytes], None] | None = schema.check_prefix,
        frame_deadline_s: float = 10.0,
    ) -> None:
        self._handler = handler
        self._eager = False
        self._on_notification = on_notification
        self._on_close = on_close
        self._max_frame = max_frame
        self._max_depth = max_depth
        self._max_values = max_values
        self._notifications = notifications
        self._requests = requests
        self._deadline_s = frame_deadline_s
        self._framer = Framer(max_frame=max_frame)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
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
        self._pending: dict[int, tuple[asyncio.Future[Any], str, Checker | None]] = {}
        self._sweep_at = MAX_PENDING_SWEEP
        self._next_id = 0
        self._abandoned: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._serving: set[int] = set()
        self.refused = 0
        """Requests and notifications refused without closing the channel (a duplicate id of
        a request still being served, an unknown method): counted, never served."""
        self._paused: set[str] = set()
        self._write_ready = asyncio.Event()
        self._write_ready.set()
        self._close_exc: BaseException | None = None
        self.closed: asyncio.Future[None] = self._loop.create_future()

    def serve_with(self, handler: RequestHandler, *, eager: bool = False) -> None:
        """Serve the peer's requests with *handler* from now on (requests before it: refused).

        *eager*: start serving each request as soon as it is read (see
        :func:`~sunroom.rpc.eager.start_eagerly`) instead of in a new task: a handler that
        completes without waiting is answered in the same event-loop step (no task, no extra
        loop iteration); at its first wait, a task carries it on. Until then it runs outside
        any task, so it must not need one (``asyncio.timeout``, ``asyncio.current_task``)
        before it awaits :func:`~sunroom.rpc.eager.in_task`.
        """
        self._handler = handler
        self._eager = eager

    @classmethod
    async def open(cls, sock: socket.socket, **options: Any) -> Channel:
        """Wrap a connected Unix stream socket; the channel owns it from now on."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # a socket that cannot keeps the system's size
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        _, proto = await loop.create_unix_connection(lambda: cls(**options), sock=sock)
        return proto

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        # uvloop's transports do not subclass asyncio.Transport; they provide its methods
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:  # noqa: D102
        try:
            self._take(memoryview(data))
        except (WireError, ProtocolError) as exc:
            self._fail(exc if isinstance(exc, ProtocolError) else ProtocolError(str(exc)))
            return
        self._watch_deadline()

    def eof_received(self) -> bool | None:  # noqa: D102
        return None

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._finish(self._close_exc or (ConnectionError(str(exc)) if exc else None))

    def pause_writing(self) -> None:  # noqa: D102
        self._write_ready.clear()

    def resume_writing(self) -> None:  # noqa: D102
        self._write_ready.set()

    # -- framing ---------------------------------------------------------------------------

    def _take(self, data: memoryview) -> None:
        """Split *data* into frames and hand each complete one on, in order."""
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

    def _dispatch(self, msg: Request | Response | Notification) -> None:
        if type(msg) is Response:
            self._answer(msg)
        elif type(msg) is Notification:
            params = msg.params
            if self._notifications is not None:
                check = self._notifications.get(msg.method)
                if check is None:
                    self.refused += 1  # an unknown notification: dropped, counted
                    return
                params = check(params)
            if self._on_notification is not None:
                self._on_notification(msg.method, params)
        else:
            assert type(msg) is Request
            if msg.id in self._serving:
                self.refused += 1  # a duplicate id of a request still being served: dropped
                return
            params = msg.params
            known = True
            if self._requests is not None:
                check = self._requests.get(msg.method)
                known = check is not None
                if check is not None:
                    params = check(params)
            if not known:
                self.refused += 1  # answered MethodNotFound without reaching the handler
            self._serving.add(msg.id)
            self._start(msg.id, msg.method, params, known)

    def _answer(self, msg: Response) -> None:
        entry = self._pending.pop(msg.id, None)
        if entry is None:
            if msg.id in self._abandoned:  # the caller gave up waiting (timeout, cancel)
                self._abandoned.discard(msg.id)
                return
            raise ProtocolError(f"response for unknown request id {msg.id}")
        fut, method, check = entry
        if fut.done():
            return
        if msg.error is not None:
            fut.set_exception(RemoteError(msg.error))
            return
        try:
            result = msg.result if check is None else check(msg.result)
        except WireError as exc:
            error = ProtocolError(f"the answer to {method!r} is malformed: {exc}")
            fut.set_exception(error)
            raise error from None
        fut.set_result(result)

    def _start(self, req_id: int, method: str, params: Any, known: bool) -> None:
        """Serve one request: eagerly (see :meth:`serve_with`) or in a task."""
        serving = self._serve(req_id, method, params, known=known)
        if not self._eager:
            self._track(self._loop.create_task(serving))
        elif (task := start_eagerly(self._loop, serving)) is not None:
            self._track(task)

    def _track(self, task: asyncio.Task[None]) -> None:
        # the task leaves the set itself, at the end of _serve (a done callback would cost
        # another turn of the event loop per request)
        self._tasks.add(task)
        if len(self._tasks) >= MAX_INCOMING_REQUESTS:
            self._pause("requests")

    def _untrack(self) -> None:
        if not self._tasks:
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.discard(cast("asyncio.Task[None]", task))
        if "requests" in self._paused and len(self._tasks) < MAX_INCOMING_REQUESTS // 2:
            self._resume("requests")

    async def _writable(self) -> None:
        while not self._write_ready.is_set() and not self.closed.done():
            await self._write_ready.wait()

    async def _serve(self, req_id: int, method: str, params: Any, *, known: bool = True) -> None:
        try:
            await self._serve_one(req_id, method, params, known=known)
        finally:
            self._serving.discard(req_id)
            self._untrack()

    async def _serve_one(self, req_id: int, method: str, params: Any, *, known: bool) -> None:
        error: RpcError | None = None
        result: Any = None
        if not self._write_ready.is_set():  # (no coroutine to create when it is)
            await self._writable()  # no work for a peer that is not reading its answers
        if self._handler is None or not known:
            error = RpcError("MethodNotFound", f"no handler for {cut(method, 60)!r}")
        else:
            try:
                result = await self._handler(method, params)
            except RpcFailure as exc:
                error = exc.error
            except asyncio.CancelledError:
                if self.closed.done():
                    return
                error = RpcError("Cancelled", "the call was cancelled on the host")
            except Exception as exc:
                error = RpcError(type(exc).__name__, str(exc))
        if not self._write_ready.is_set():
            await self._writable()
        if self.closed.done():
            return
        if error is not None:
            error = RpcError(cut(error.type, 200), cut(error.message), error.data)
            self._write(Response(req_id, error, None).to_wire())
            return
        try:
            self._write([1, req_id, None, result])
        except WireError as exc:
            self._write(Response(req_id, RpcError("EncodeError", cut(str(exc))), None).to_wire())

    # -- sending ---------------------------------------------------------------------------

    def _write(
        self, message: list[Any], tail: Sequence[bytes | bytearray | memoryview] = ()
    ) -> None:
        if self._transport is None or self.closed.done():
            raise ClosedError("the channel is closed") from self._close_exc
        if not tail:
            self._transport.write(self._framer.frame(message))
            return
        for part in self._framer.frame_parts(message, tail):  # the tail is not joined
            self._transport.write(part)

    def request(
        self,
        method: str,
        params: Any = None,
        *,
        check: Checker | None = None,
        tail: Sequence[bytes | bytearray | memoryview] = (),
    ) -> asyncio.Future[Any]:
        """Send a request now and return the future of its result (no task is created).

        The future holds *check* applied to the result when given: a result that does not
        pass is a protocol violation (the channel closes; the future fails with ProtocolError).
        It fails with RemoteError when the peer answers with an error, ProtocolError or
        ClosedError when the channel closes first. Cancelling it abandons the request: a late
        answer is then dropped instead of being a protocol error. Raises ProtocolError at once
        when *params* cannot be encoded or exceed the frame cap, ClosedError when closed.

        *tail*: buffers sent as one binary in place of the ``b""`` that *params* ends with (see
        :meth:`~sunroom.rpc.codec.Framer.frame_parts`), written as they are, never joined.
        """
        self._next_id = req_id = (self._next_id + 1) & 0xFFFFFFFF
        fut: asyncio.Future[Any] = self._loop.create_future()
        try:
            self._write([0, req_id, method, params], tail)
        except WireError as exc:
            raise ProtocolError(f"cannot send {method!r}: {exc}") from None
        if len(self._pending) >= self._sweep_at:
            self._sweep()
        # an abandoned request (its future done before the answer came) stays here until its
        # answer arrives and is dropped, or until a sweep: no done callback per request
        self._pending[req_id] = (fut, method, check)
        return fut

    def _sweep(self) -> None:
        """Move the requests whose futures are done (abandoned) out of the pending table."""
        for req_id in [i for i, (fut, _, _) in self._pending.items() if fut.done()]:
            del self._pending[req_id]
            if len(self._abandoned) >= 4096:
                self._abandoned.clear()
            self._abandoned.add(req_id)
        self._sweep_at = max(MAX_PENDING_SWEEP, 2 * len(self._pending))  # amortised O(1)

    async def call(self, method: str, params: Any = None, *, check: Checker | None = None) -> Any:
        """Send a request and await its result; see :meth:`request` for *check* and errors.

        Waits for the socket's write buffer to drain first when it is full (backpressure).
        """
        fut = self.request(method, params, check=check)
        await self._writable()
        return await fut

    def send_fds(self, fds: list[int]) -> None:
        """Pass *fds* to the peer in one ``SCM_RIGHTS`` message carrying the byte ``F``.

        For the one exchange that is not framed (a fork's sockets): the peer must be waiting
        for it, and nothing may be queued for writing, so the byte cannot land inside a frame.
        Raises ConnectionError when the channel is closed, ProtocolError when output is queued.
        """
        if self._transport is None or self.closed.done():
            raise ConnectionError("the channel is closed")
        if self._transport.get_write_buffer_size():
            raise ProtocolError("cannot pass fds while frames wait to be written")
        raw = self._transport.get_extra_info("socket")
        with socket.socket(fileno=os.dup(raw.fileno())) as dup:
            socket.send_fds(dup, [b"F"], fds)

    def notify(self, method: str, params: Any = None) -> None:
        """Send a notification; raises ClosedError if the channel is closed."""
        self._write([2, method, params])

    # -- closing ---------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self._close_exc is None:
            self._close_exc = exc
        if self._transport is not None:
            self._transport.abort()
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if self.closed.done():
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._catch_up is not None:
            self._catch_up.cancel()
            self._catch_up = None
        err: BaseException = (
            exc if exc is not None else ClosedError("the kernel closed the channel")
        )
        for fut, _, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        for task in self._tasks:
            task.cancel()  # _serve takes each out of the set as it ends
        if self._decoder is not None:
            self._decoder.cancel()
        self._buf.clear()
        if self._big is not None:
            _release(self._big)
            self._big = None
        while self._backlog:
            _release(self._backlog.popleft())
        if self._spare_timer is not None:
            self._spare_timer.cancel()
        self._drop_spare()
        self._write_ready.set()  # nobody waits to write on a closed channel
        self.closed.set_result(None)
        if self._on_close is not None:
            self._on_close(exc)

    @property
    def close_reason(self) -> BaseException | None:
        """Why the channel closed: a ProtocolError, a connection error, or None (clean)."""
        return self._close_exc

    async def aclose(self) -> None:
        """Close the socket, fail pending calls with ClosedError and wait for served tasks."""
        if self._transport is not None:
            self._transport.close()
        self._finish(None)
        tasks = list(self._tasks)
        if self._decoder is not None:
            tasks.append(self._decoder)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
