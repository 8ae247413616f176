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

The receive path is :mod:`sunroom.rpc.channel_receive`, the serving of what arrives
:mod:`sunroom.rpc.channel_serve`; this module holds the socket, the host's own calls and the
closing.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Generic, Protocol, TypedDict, TypeVar, Unpack, cast, final, overload

from sunroom.errors import ClosedError, ProtocolError
from sunroom.rpc import schema
from sunroom.rpc.channel_receive import (
    BIG_FRAME,
    INLINE_FRAME,
    SPARE_FRAME,
    SPARE_IDLE_S,
    receive_buffer,
)
from sunroom.rpc.channel_serve import (
    MAX_ERROR_TEXT,
    MAX_INCOMING_REQUESTS,
    ChannelServing,
    NotificationHandler,
    RequestHandler,
    RpcFailure,
    cut,
)
from sunroom.rpc.codec import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_VALUES,
    Framer,
    WireError,
)
from sunroom.rpc.messages import Response, RpcError
from sunroom.rpc.schema import Check, Checker
from sunroom.rpc.settle import settle

__all__ = [
    "BIG_FRAME",
    "INLINE_FRAME",
    "MAX_ERROR_TEXT",
    "MAX_INCOMING_REQUESTS",
    "MAX_PENDING_SWEEP",
    "SEND_BUFFER",
    "SPARE_FRAME",
    "SPARE_IDLE_S",
    "Channel",
    "CloseHandler",
    "NotificationHandler",
    "RemoteError",
    "RequestHandler",
    "RpcFailure",
    "cut",
]

CloseHandler = Callable[[BaseException | None], None]

T = TypeVar("T")

MAX_PENDING_SWEEP: Final = 1024
"""Requests awaiting an answer beyond which the channel forgets those abandoned meanwhile (the
next sweep waits until there are twice as many left as after this one)."""

SEND_BUFFER: Final = 512 * 1024
"""``SO_SNDBUF`` of the socket (Linux doubles it for its bookkeeping): a 1 MiB file chunk mostly
goes straight into the socket instead of through the transport's buffer (a copy), while a
peer that stops reading still gets only a couple of answers computed before the channel waits."""


class RemoteError(Exception):
    """The peer answered a call with an error map; ``error`` holds it."""

    def __init__(self, error: RpcError) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.error = error


@final
class Channel(ChannelServing, asyncio.BufferedProtocol):
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
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._on_close = on_close
        self._framer = Framer(max_frame=max_frame)
        self._init_receiving(
            max_frame=max_frame,
            max_depth=max_depth,
            max_values=max_values,
            early_check=early_check,
            frame_deadline_s=frame_deadline_s,
        )
        self._init_serving(
            handler=handler,
            on_notification=on_notification,
            notifications=notifications,
            requests=requests,
        )
        self._pending: dict[int, _Waiting] = {}
        self._sweep_at = MAX_PENDING_SWEEP
        self._next_id = 0
        self._abandoned: set[int] = set()
        self._write_ready = asyncio.Event()
        self._write_ready.set()
        self._close_exc: BaseException | None = None
        self.closed: asyncio.Future[None] = self._loop.create_future()

    @classmethod
    async def open(cls, sock: socket.socket, **options: Unpack[ChannelOptions]) -> Channel:
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

    def get_buffer(self, sizehint: int) -> memoryview:  # noqa: D102
        # the thread's receive buffer: _take copies what it keeps before it hands anything on,
        # so no other read can overwrite bytes still needed (a Protocol's recv() allocated a
        # fresh 256 KiB bytes per read: mmap, mremap and munmap each time)
        return receive_buffer()

    def buffer_updated(self, nbytes: int) -> None:  # noqa: D102
        try:
            self._take(receive_buffer()[:nbytes])
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

    # -- the host's calls -----------------------------------------------------------------

    def _answer(self, msg: Response) -> None:
        entry = self._pending.pop(msg.id, None)
        if entry is None:
            if msg.id in self._abandoned:  # the caller gave up waiting (timeout, cancel)
                self._abandoned.discard(msg.id)
                return
            raise ProtocolError(f"response for unknown request id {msg.id}")
        if entry.done():
            return
        if msg.error is not None:
            entry.fail(RemoteError(msg.error))
            return
        try:
            entry.answer(msg.result)
        except WireError as exc:
            error = ProtocolError(f"the answer to {entry.method!r} is malformed: {exc}")
            entry.fail(error)
            raise error from None

    # -- sending ---------------------------------------------------------------------------

    def _write(
        self,
        message: list[object],
        tail: Sequence[bytes | bytearray | memoryview] = (),
        fds: Sequence[int] = (),
    ) -> None:
        if self._transport is None or self.closed.done():
            raise ClosedError("the channel is closed") from self._close_exc
        if fds:
            self._write_with_fds(self._framer.frame(message), fds)
            return
        if not tail:
            self._transport.write(self._framer.frame(message))
            return
        for part in self._framer.frame_parts(message, tail):  # the tail is not joined
            self._transport.write(part)

    def _write_with_fds(self, data: bytes, fds: Sequence[int]) -> None:
        """Send *data* with *fds* in one ``SCM_RIGHTS`` message, ahead of the transport.

        The descriptors travel with the frame's first bytes, so the peer holds them by the
        time it reads the frame (``BlockingChannel.take_fds``). Raises ProtocolError while
        frames wait to be written (the frame would overtake them) or when the socket takes
        nothing now.
        """
        assert self._transport is not None
        if self._transport.get_write_buffer_size():
            raise ProtocolError("cannot pass fds while frames wait to be written")
        raw = self._transport.get_extra_info("socket")
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        with socket.socket(fileno=os.dup(raw.fileno())) as dup:
            try:
                sent = dup.sendmsg([data], rights)
            except BlockingIOError:
                raise ProtocolError("the peer is not reading: cannot pass fds") from None
        if sent < len(data):  # the rest of the frame as any other bytes, in order
            self._transport.write(data[sent:])

    @overload
    def request(
        self,
        method: str,
        params: object = None,
        *,
        check: Check[T],
        tail: Sequence[bytes | bytearray | memoryview] = (),
        fds: Sequence[int] = (),
    ) -> asyncio.Future[T]: ...
    @overload
    def request(
        self,
        method: str,
        params: object = None,
        *,
        check: None = None,
        tail: Sequence[bytes | bytearray | memoryview] = (),
        fds: Sequence[int] = (),
    ) -> asyncio.Future[object]: ...
    def request(
        self,
        method: str,
        params: object = None,
        *,
        check: Check[T] | None = None,
        tail: Sequence[bytes | bytearray | memoryview] = (),
        fds: Sequence[int] = (),
    ) -> asyncio.Future[T] | asyncio.Future[object]:
        """Send a request now and return the future of its result (no task is created).

        The future holds *check* applied to the result when given: a result that does not
        pass is a protocol violation (the channel closes; the future fails with ProtocolError).
        It fails with RemoteError when the peer answers with an error, ProtocolError or
        ClosedError when the channel closes first. Cancelling it abandons the request: a late
        answer is then dropped instead of being a protocol error. Raises ProtocolError at once
        when *params* cannot be encoded or exceed the frame cap, ClosedError when closed.

        *tail*: buffers sent as one binary in place of the ``b""`` that *params* ends with (see
        :meth:`~sunroom.rpc.codec.Framer.frame_parts`), written as they are, never joined.

        *fds*: descriptors passed with the request in one ``SCM_RIGHTS`` message (a fork's
        sockets), which the peer holds once it has read the request; ProtocolError at once
        while other frames wait to be written.
        """
        self._next_id = req_id = (self._next_id + 1) & 0xFFFFFFFF
        entry: _Call[T] | _Call[object] = (
            _Call(self._loop, method, _as_is) if check is None else _Call(self._loop, method, check)
        )
        try:
            self._write([0, req_id, method, params], tail, fds)
        except WireError as exc:
            raise ProtocolError(f"cannot send {method!r}: {exc}") from None
        if len(self._pending) >= self._sweep_at:
            self._sweep()
        # an abandoned request (its future done before the answer came) stays here until its
        # answer arrives and is dropped, or until a sweep: no done callback per request
        self._pending[req_id] = entry
        return entry.future

    def _sweep(self) -> None:
        """Move the requests whose futures are done (abandoned) out of the pending table."""
        for req_id in [i for i, entry in self._pending.items() if entry.done()]:
            del self._pending[req_id]
            if len(self._abandoned) >= 4096:
                self._abandoned.clear()
            self._abandoned.add(req_id)
        self._sweep_at = max(MAX_PENDING_SWEEP, 2 * len(self._pending))  # amortised O(1)

    @overload
    async def call(self, method: str, params: object = None, *, check: Check[T]) -> T: ...
    @overload
    async def call(self, method: str, params: object = None, *, check: None = None) -> object: ...
    async def call(
        self, method: str, params: object = None, *, check: Check[T] | None = None
    ) -> T | object:
        """Send a request and await its result; see :meth:`request` for *check* and errors.

        Waits for the socket's write buffer to drain first when it is full (backpressure).
        """
        fut = (
            self.request(method, params)
            if check is None
            else self.request(method, params, check=check)
        )
        await self._writable()
        return await fut

    def notify(self, method: str, params: object = None) -> None:
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
        for entry in self._pending.values():
            if not entry.done():
                entry.fail(err)
        self._pending.clear()
        for task in self._tasks:
            task.cancel()  # _serve takes each out of the set as it ends
        if self._decoder is not None:
            self._decoder.cancel()
        self._drop_received()
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
            await settle(task)  # its end is not news; a cancel of the caller's own task is


class ChannelOptions(TypedDict, total=False):
    """The keyword arguments of :class:`Channel` (and of :meth:`Channel.open`)."""

    handler: RequestHandler | None
    on_notification: NotificationHandler | None
    on_close: CloseHandler | None
    max_frame: int
    max_depth: int
    max_values: int | None
    notifications: Mapping[str, Checker] | None
    requests: Mapping[str, Checker] | None
    early_check: Callable[[bytes], None] | None
    frame_deadline_s: float


class _Waiting(Protocol):
    """A request awaiting its answer, whatever its result's type (see :class:`_Call`)."""

    @property
    def method(self) -> str:
        """The request's method, for error messages."""
        ...

    def done(self) -> bool:
        """Whether its future is done (answered, failed, or abandoned by its caller)."""
        ...

    def answer(self, result: object) -> None:
        """Check *result* and set it as the future's; raises WireError when it does not pass."""
        ...

    def fail(self, exc: BaseException) -> None:
        """Fail the future with *exc*."""
        ...


@final
class _Call(Generic[T]):
    """A request whose future holds its result as *check* returns it."""

    __slots__ = ("check", "future", "method")

    def __init__(self, loop: asyncio.AbstractEventLoop, method: str, check: Check[T]) -> None:
        self.method = method
        self.check = check
        self.future: asyncio.Future[T] = loop.create_future()

    def done(self) -> bool:  # noqa: D102
        return self.future.done()

    def answer(self, result: object) -> None:  # noqa: D102
        self.future.set_result(self.check(result))

    def fail(self, exc: BaseException) -> None:  # noqa: D102
        self.future.set_exception(exc)


def _as_is(result: object) -> object:
    """The check of a request that has none: its result as it came."""
    return result
