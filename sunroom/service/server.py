"""Serving the app with uvicorn: :func:`bind` and :func:`serve`.

The socket is bound before uvicorn starts, so the caller knows the port (also for port 0)
and can print the URL and token first. Connections are accepted by a
:class:`~sunroom.service.health.HealthGate` thread, which answers ``GET /healthz`` itself and
hands every other connection to uvicorn on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Generator, Sequence
from contextlib import contextmanager
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from sunroom.sandbox.functions import HostFunction
from sunroom.service.app import create_app
from sunroom.service.config import MAX_HEADER_BYTES, ServiceConfig
from sunroom.service.files import ZEROCOPY
from sunroom.service.health import HealthGate
from sunroom.service.models import resolve_model
from sunroom.service.sessions import ModelResolver

__all__ = ["QuietExitServer", "bind", "serve"]

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
_REASONS[503] = b"Service Unavailable"


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a connection that was just refused."""


def _protocol(config: ServiceConfig) -> type[HttpToolsProtocol]:
    """The httptools protocol of uvicorn with JSON errors, a head cap, a read deadline, caps.

    - Every error answered here (a malformed request, a head over ``MAX_HEADER_BYTES``, a
      request not received within ``read_timeout_s``, too many connections) is the service's
      JSON error shape, and the connection is closed after it.
    - The head cap is checked on what was parsed (the URL and the headers) and on the bytes
      read while a head stays incomplete, so an endless header line is refused soon after it
      passes the cap (httptools holds a partial line in memory until it ends).
    - The read deadline runs from the first byte of a request (or the connection's start)
      until the whole request, body included, has arrived; idle keep-alive connections fall
      under uvicorn's keep-alive timeout instead.
    """

    class Protocol(_GuardedProtocol):
        read_timeout = config.read_timeout_s
        total_cap = config.max_connections
        client_cap = config.max_connections_per_client

    return Protocol


class _GuardedProtocol(HttpToolsProtocol):
    """The protocol :func:`_protocol` returns, its limits set from the service's config."""

    read_timeout: float
    total_cap: int
    client_cap: int
    _deadline: asyncio.TimerHandle | None = None
    _in_request = False  # a request has begun and not fully arrived
    _in_head = False  # ... and its head has not fully arrived
    # two lower bounds of the current head's size: the URL and headers parsed so far, and
    # the bytes of the reads that lay wholly within it (the head was incomplete before
    # and after them); each is checked against the cap
    _head_parsed = 0
    _head_read = 0
    _refused = False

    def _refuse(self, status: int, kind: str, message: str) -> None:
        """Answer *status* with the JSON error shape and close the connection."""
        self._refused = True
        body = json.dumps({"error": {"type": kind, "message": message}}).encode()
        head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Error"))
        head += b"content-type: application/json\r\nconnection: close\r\n"
        head += b"content-length: %d\r\n\r\n" % len(body)
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else None
        peers = [getattr(c, "client", None) for c in self.connections]
        same = sum(1 for peer in peers if peer is not None and peer[0] == host)
        if len(self.connections) > self.total_cap or same > self.client_cap:
            self._refuse(
                503,
                "TooManyConnections",
                "the server has too many open connections; retry later",
            )
            return
        self._arm()

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            self._refuse(
                408,
                "RequestTimeout",
                f"the request was not received within {self.read_timeout:g} seconds",
            )
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and closing: nothing more is parsed
        self._unset_keepalive_if_required()
        if not self._in_request:
            self._arm()  # the first byte of a request (or of the connection)
        within_head = self._in_head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            self._disarm()
            if not self._refused:
                self._bad_request(exc.__context__)
            return
        if self._in_head and within_head:
            self._head_read += len(data)  # every byte of this read belongs to the head
            if self._head_read > MAX_HEADER_BYTES:
                with contextlib.suppress(_Refused):
                    self._head_too_large()
        if self._refused or not self._in_request:
            self._disarm()  # refused, or the whole request arrived, or none of the next

    def _bad_request(self, cause: BaseException | None) -> None:
        if isinstance(cause, UnicodeDecodeError):
            self._refuse(400, "BadRequest", "the request target is not ASCII")
        else:
            self._refuse(400, "BadRequest", "the request is not valid HTTP/1.1")

    def _head_too_large(self) -> None:
        self._refuse(
            431,
            "HeadersTooLarge",
            f"the request headers are over the limit of {MAX_HEADER_BYTES} bytes",
        )
        raise _Refused  # out of the parser's callback: it parses no more

    def _count_head(self, size: int) -> None:
        self._head_parsed += size
        if self._head_parsed > MAX_HEADER_BYTES:
            self._head_too_large()

    def on_message_begin(self) -> None:
        self._in_request = self._in_head = True
        self._head_parsed = self._head_read = 0
        super().on_message_begin()
        self.scope["extensions"] = {ZEROCOPY: {}}

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.send = _with_sendfile(cycle)  # type: ignore[method-assign,assignment]
        super()._start_asgi_task(cycle, app)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.body or cycle.response_complete or self.parser.should_upgrade():
            super().on_body(body)  # appended to what the app has not read yet
            return
        # the first piece since the app last read: kept as it is rather than copied into
        # uvicorn's bytearray (its receive() takes bytes() of it: for bytes, no copy)
        cycle.body = body  # type: ignore[assignment]
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._in_request = self._in_head = False
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:
            self._bad_request(None)


def _with_sendfile(cycle: RequestResponseCycle) -> Callable[[Any], Awaitable[None]]:
    """*cycle*'s ASGI send, taking ``http.response.zerocopysend`` messages as well.

    Such a message (after ``http.response.start`` with a ``content-length``) carries ``file``,
    a file object open for reading, ``offset``, ``count`` and ``more_body``; the bytes go from
    the file to the socket with ``sendfile`` (``loop.sendfile``: the transport's buffer is
    flushed first and reading pauses meanwhile; on a loop without it, such as uvloop, they are
    read and written in 256 KiB pieces instead); none for a ``HEAD`` request. When the file
    ends before *count* bytes, or the client goes away, the connection is closed and the
    response stays incomplete.
    """
    plain = cycle.send

    async def send(message: Any) -> None:
        if message["type"] != ZEROCOPY:
            await plain(message)
            return
        if cycle.scope["method"] == "HEAD":  # the head only: no bytes of the file
            more = message.get("more_body", False)
            await plain({"type": "http.response.body", "body": b"", "more_body": more})
            return
        offset, count = message.get("offset", 0), message["count"]
        if (
            not cycle.response_started
            or cycle.response_complete
            or cycle.chunked_encoding is not False
            or count > cycle.expected_content_length
        ):
            raise RuntimeError("a zerocopysend must fit the content-length of a started response")
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected or cycle.transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        try:
            sent = (
                await loop.sendfile(cycle.transport, message["file"], offset, count) if count else 0
            )
            cycle.expected_content_length -= sent
        except NotImplementedError:  # a loop without sendfile (uvloop): read and write instead
            sent = await _send_read(plain, message["file"], offset, count)
        except ConnectionError:  # the client went away: nobody is left to answer
            cycle.transport.close()
            return
        if sent < count:  # the file shrank meanwhile: the body can only be cut short
            cycle.transport.close()
            return
        if not message.get("more_body", False):
            await plain({"type": "http.response.body", "body": b"", "more_body": False})

    return send


_READ_CHUNK = 256 * 1024


async def _send_read(
    send: Callable[[Any], Awaitable[None]], file: Any, offset: int, count: int
) -> int:
    """Send *count* bytes of *file* from *offset* as body messages; the bytes read (fewer: EOF).

    The reads run in a worker thread (a file read may block); ``send`` keeps the transport's
    flow control and the content-length count.
    """
    sent = 0
    fd = file.fileno()
    while sent < count:
        chunk = await asyncio.to_thread(os.pread, fd, min(_READ_CHUNK, count - sent), offset + sent)
        if not chunk:
            break
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        sent += len(chunk)
    return sent


class QuietExitServer(uvicorn.Server):
    """uvicorn, ending with exit status 0 on SIGINT/SIGTERM: the signal is not re-raised.

    Used by ``sunroom serve`` and ``sunroom mcp --http``.
    """

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Route SIGINT/SIGTERM to a clean shutdown (main thread only); restore after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        import signal

        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


class _Server(QuietExitServer):
    """The uvicorn server, ending cleanly on SIGTERM/SIGINT, accepting through a health gate.

    The signal is not re-raised at the end (``sunroom serve`` exits 0), and open SSE streams
    are told to end before the connections are drained. The listening socket is not given to
    uvicorn: a :class:`HealthGate` accepts on it once the app has started, answers health
    checks in its thread and hands the other connections to uvicorn's protocol on the loop.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        closing: asyncio.Event,
        *,
        health: Callable[[], dict[str, Any]],
        service: ServiceConfig,
    ) -> None:
        super().__init__(config)
        self._closing = closing
        self._health = health
        self._service = service
        self._gate: HealthGate | None = None
        self._adopting: set[asyncio.Task[Any]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start the app (lifespan), then the gate on the one socket in *sockets*."""
        if sockets is None or len(sockets) != 1:
            raise ValueError("the server is started with exactly one listening socket")
        await super().startup(sockets=[])  # uvicorn listens on nothing: the gate accepts
        if not self.started:
            return
        loop = asyncio.get_running_loop()
        config = self.config

        def protocol() -> asyncio.Protocol:  # what uvicorn's startup builds for its listener
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )
            return made

        async def adopt(sock: socket.socket) -> None:
            try:
                await loop.connect_accepted_socket(protocol, sock)
            except OSError:
                sock.close()  # reset by the client meanwhile

        def schedule(sock: socket.socket) -> None:  # on the loop, from the gate's call
            task = loop.create_task(adopt(sock))
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

        def hand_over(sock: socket.socket) -> None:  # from the gate's thread
            loop.call_soon_threadsafe(schedule, sock)

        def failed() -> None:
            self.should_exit = True

        self._gate = HealthGate(
            sockets[0],
            health=self._health,
            host_allowed=self._service.host_allowed,
            max_head=MAX_HEADER_BYTES,
            adopt=hand_over,
            failed=failed,
        )
        self._gate.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._closing.set()
        if self._gate is not None:
            self._gate.stop()  # no new connections; then uvicorn drains the open ones
        await super().shutdown(sockets)


def bind(config: ServiceConfig) -> socket.socket:
    """A listening TCP socket on ``config.host:config.port``. Raises OSError."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # proto=IPPROTO_TCP lets asyncio set TCP_NODELAY on every accepted connection (it checks
    # the protocol number); TCP_NODELAY on the listener is inherited as well. Without it,
    # Nagle's algorithm and the client's delayed ACK add ~40 ms to each keep-alive response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((config.host, config.port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def serve(
    config: ServiceConfig,
    *,
    sock: socket.socket | None = None,
    resolve: ModelResolver = resolve_model,
    functions: Sequence[Callable[..., Any] | HostFunction] = (),
    log_level: str = "warning",
    started: Callable[[uvicorn.Server], None] | None = None,
) -> None:
    """Run the service until the server is told to exit (SIGINT/SIGTERM, ``should_exit``).

    *config* must carry a token. *started* is called with the uvicorn server once it serves.
    """
    app = create_app(config, resolve=resolve, functions=functions)
    sock = sock or bind(config)
    server = _Server(
        uvicorn.Config(
            app,
            http=_protocol(config),
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=1,
            access_log=False,
        ),
        closing=app.state.closing,
        health=app.state.health,
        service=config,
    )
    if started is not None:

        async def announce() -> None:
            while not server.started and not server.should_exit:  # noqa: ASYNC110 - a bool flag
                await asyncio.sleep(0.01)
            if server.started:
                started(server)

        task = asyncio.get_running_loop().create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        if started is not None:
            task.cancel()
        sock.close()
