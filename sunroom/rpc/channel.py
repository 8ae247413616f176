"""The host end of a kernel connection: an asyncio msgpack-RPC peer.

A :class:`Channel` owns one connected stream socket. Both sides may call; many requests may be
in flight; incoming requests are served by an async handler, incoming notifications by a plain
callback. Any protocol violation (undecodable, oversized, too deep, badly shaped, a response to
an unknown id, a frame left half-sent past the read deadline) closes the channel with
:class:`~sunroom.errors.ProtocolError`; every pending call then fails with that error and
``on_close`` is told, so the owner can kill the kernel. The host process itself never crashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast, final

from sunroom.errors import ClosedError, ProtocolError
from sunroom.rpc.codec import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FRAME,
    WireError,
    decode,
    frame,
    take_frames,
)
from sunroom.rpc.messages import Notification, Request, Response, RpcError, parse_message

RequestHandler = Callable[[str, Any], Awaitable[Any]]
NotificationHandler = Callable[[str, Any], None]
CloseHandler = Callable[[BaseException | None], None]

MAX_INCOMING_REQUESTS: Final = 256
"""Requests from the peer served at once; beyond this the channel stops reading (backpressure)."""


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


@final
class Channel(asyncio.Protocol):
    """Async msgpack-RPC endpoint. Build with :meth:`open`; close with :meth:`aclose`."""

    def __init__(
        self,
        *,
        handler: RequestHandler | None = None,
        on_notification: NotificationHandler | None = None,
        on_close: CloseHandler | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_depth: int = DEFAULT_MAX_DEPTH,
        frame_deadline_s: float = 10.0,
    ) -> None:
        self._handler = handler
        self._on_notification = on_notification
        self._on_close = on_close
        self._max_frame = max_frame
        self._max_depth = max_depth
        self._deadline_s = frame_deadline_s
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._need = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._abandoned: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading_paused = False
        self._write_ready = asyncio.Event()
        self._write_ready.set()
        self._close_exc: BaseException | None = None
        self.closed: asyncio.Future[None] = self._loop.create_future()

    def serve_with(self, handler: RequestHandler) -> None:
        """Serve the peer's requests with *handler* from now on (requests before it: refused)."""
        self._handler = handler

    @classmethod
    async def open(cls, sock: socket.socket, **options: Any) -> Channel:
        """Wrap a connected Unix stream socket; the channel owns it from now on."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        _, proto = await loop.create_unix_connection(lambda: cls(**options), sock=sock)
        return proto

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        # uvloop's transports do not subclass asyncio.Transport; they provide its methods
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:  # noqa: D102
        self._buf += data
        try:
            self._drain_frames()
        except (WireError, ProtocolError) as exc:
            self._fail(ProtocolError(str(exc)))

    def eof_received(self) -> bool | None:  # noqa: D102
        return None

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._finish(self._close_exc or (ConnectionError(str(exc)) if exc else None))

    def pause_writing(self) -> None:  # noqa: D102
        self._write_ready.clear()

    def resume_writing(self) -> None:  # noqa: D102
        self._write_ready.set()

    # -- framing ---------------------------------------------------------------------------

    def _drain_frames(self) -> None:
        for payload in take_frames(self._buf, self._max_frame):
            self._dispatch(parse_message(decode(payload, max_depth=self._max_depth)))
            if self._transport is None or self.closed.done():
                return
        if self._buf:
            if self._deadline is None:
                self._deadline = self._loop.call_later(self._deadline_s, self._stalled)
        elif self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _stalled(self) -> None:
        self._deadline = None
        if self._buf:
            self._fail(ProtocolError(f"a frame stayed incomplete for {self._deadline_s} s"))

    def _dispatch(self, msg: Request | Response | Notification) -> None:
        if type(msg) is Response:
            fut = self._pending.pop(msg.id, None)
            if fut is None:
                if msg.id in self._abandoned:  # the caller gave up waiting (timeout, cancel)
                    self._abandoned.discard(msg.id)
                    return
                raise ProtocolError(f"response for unknown request id {msg.id}")
            if not fut.done():
                if msg.error is None:
                    fut.set_result(msg.result)
                else:
                    fut.set_exception(RemoteError(msg.error))
        elif type(msg) is Notification:
            if self._on_notification is not None:
                self._on_notification(msg.method, msg.params)
        else:
            assert type(msg) is Request
            task = self._loop.create_task(self._serve(msg))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)
            if len(self._tasks) >= MAX_INCOMING_REQUESTS and self._transport is not None:
                self._transport.pause_reading()
                self._reading_paused = True

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._reading_paused and len(self._tasks) < MAX_INCOMING_REQUESTS // 2:
            self._reading_paused = False
            if self._transport is not None and not self.closed.done():
                self._transport.resume_reading()

    async def _serve(self, req: Request) -> None:
        error: RpcError | None = None
        result: Any = None
        if self._handler is None:
            error = RpcError("MethodNotFound", f"no handler for {req.method!r}")
        else:
            try:
                result = await self._handler(req.method, req.params)
            except RpcFailure as exc:
                error = exc.error
            except asyncio.CancelledError:
                if self.closed.done():
                    return
                error = RpcError("Cancelled", "the call was cancelled on the host")
            except Exception as exc:
                error = RpcError(type(exc).__name__, str(exc))
        if self.closed.done():
            return
        try:
            self._write(Response(req.id, error, result).to_wire())
        except WireError as exc:
            self._write(Response(req.id, RpcError("EncodeError", str(exc)), None).to_wire())

    # -- sending ---------------------------------------------------------------------------

    def _write(self, message: list[Any]) -> None:
        if self._transport is None or self.closed.done():
            raise ClosedError("the channel is closed") from self._close_exc
        self._transport.write(frame(message, max_frame=self._max_frame))

    def request(self, method: str, params: Any = None) -> asyncio.Future[Any]:
        """Send a request now and return the future of its result (no task is created).

        The future fails with RemoteError when the peer answers with an error, ProtocolError or
        ClosedError when the channel closes first. Cancelling it abandons the request: a late
        answer is then dropped instead of being a protocol error. Raises ProtocolError at once
        when *params* cannot be encoded or exceed the frame cap, ClosedError when closed.
        """
        self._next_id = req_id = (self._next_id + 1) & 0xFFFFFFFF
        fut: asyncio.Future[Any] = self._loop.create_future()
        try:
            self._write([0, req_id, method, params])
        except WireError as exc:
            raise ProtocolError(f"cannot send {method!r}: {exc}") from None
        self._pending[req_id] = fut
        fut.add_done_callback(lambda f: self._settled(req_id, f))
        return fut

    def _settled(self, req_id: int, fut: asyncio.Future[Any]) -> None:
        if self._pending.pop(req_id, None) is not None and not self.closed.done():
            if len(self._abandoned) >= 4096:
                self._abandoned.clear()
            self._abandoned.add(req_id)

    async def call(self, method: str, params: Any = None) -> Any:
        """Send a request and await its result; see :meth:`request` for what it raises.

        Waits for the socket's write buffer to drain first when it is full (backpressure).
        """
        fut = self.request(method, params)
        if not self._write_ready.is_set():
            await self._write_ready.wait()
        return await fut

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
        err: BaseException = (
            exc if exc is not None else ClosedError("the kernel closed the channel")
        )
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        for task in self._tasks:
            task.cancel()
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
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
