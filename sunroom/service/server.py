"""Serving the app with uvicorn: :func:`bind` and :func:`serve`.

The socket is bound before uvicorn starts, so the caller knows the port (also for port 0)
and can print the URL and token first. Connections are accepted by a
:class:`~sunroom.service.health.HealthGate` thread, which answers ``GET /healthz`` itself and
hands every other connection to uvicorn on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from sunroom.sandbox.functions import HostFunction
from sunroom.service.app import create_app
from sunroom.service.config import MAX_HEADER_BYTES, ServiceConfig
from sunroom.service.health import HealthGate
from sunroom.service.models import resolve_model
from sunroom.service.sessions import ModelResolver

__all__ = ["bind", "serve"]

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
_REASONS[503] = b"Service Unavailable"


def _protocol(config: ServiceConfig) -> type[H11Protocol]:
    """The h11 protocol of uvicorn with JSON errors, a read deadline and connection caps."""
    read_timeout = config.read_timeout_s
    total_cap = config.max_connections
    client_cap = config.max_connections_per_client

    class Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def _refuse(self, status: int, kind: str, message: str) -> None:
            """Answer *status* with the JSON error shape and close the connection."""
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
            if len(self.connections) > total_cap or same > client_cap:
                self._refuse(
                    503,
                    "TooManyConnections",
                    "the server has too many open connections; retry later",
                )
                return
            self._arm()

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(read_timeout, self._read_timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _read_timed_out(self) -> None:
            self._deadline = None
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and (
                self.cycle is None
                or self.cycle.response_complete
                or not self.cycle.response_started
            ):
                self._refuse(
                    408,
                    "RequestTimeout",
                    f"the request was not received within {read_timeout:g} seconds",
                )
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and self._deadline is None:
                self._arm()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)
            if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
                self._disarm()  # the whole request arrived
            elif self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                self._disarm()  # idle: uvicorn's keep-alive timeout applies

        def handle_events(self) -> None:
            try:
                super().handle_events()
            except UnicodeDecodeError:
                self._refuse(400, "BadRequest", "the request target is not ASCII")

        def send_400_response(self, msg: str) -> None:
            if len(self.conn.trailing_data[0]) > MAX_HEADER_BYTES:
                self._refuse(
                    431,
                    "HeadersTooLarge",
                    f"the request headers are over the limit of {MAX_HEADER_BYTES} bytes",
                )
            else:
                self._refuse(400, "BadRequest", "the request is not valid HTTP/1.1")

    return Protocol


class _Server(uvicorn.Server):
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

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
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
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
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
