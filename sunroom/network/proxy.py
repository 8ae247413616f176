"""The host-side egress proxy of one kernel: HTTP CONNECT and plain HTTP forwarding.

A kernel reaches it on the ``127.0.0.1`` listener its sandbox handed over through the proxy's
Unix socket (:mod:`~sunroom.network.handoff`; its sandbox has no other way out); without a
hand-off, each connection to the Unix socket is a client. Each connection
carries one CONNECT (relayed byte for byte, or terminated with the proxy's CA when headers must
be injected over TLS) or one absolute-form plain HTTP request (forwarded in origin form with
``Connection: close``). Every connection, allowed or refused, ends in one :class:`Connection`
record. Requests are parsed with h11; nothing of the kernel's headers or the injected values
reaches a record or a log.

Limits (each with a test): ``max_connections`` concurrent connections (more get 503 at once),
a request head of at most :data:`MAX_HEAD_BYTES` (else 431) that must arrive within
``head_timeout_s`` (else 408), the policy's connect timeout (504), idle timeout and byte budget.

Beside it: :mod:`~sunroom.network.flow` (the record, a connection's bookkeeping, the byte
meter), :mod:`~sunroom.network.tunnel` (relaying a CONNECT tunnel, on relay threads, and the
idle-timeout supervisor) and :mod:`~sunroom.network.forward` (forwarding one HTTP request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import h11

from sunroom.errors import UsageError
from sunroom.network import relay_threads
from sunroom.network.flow import Connection, Ended, Flow, Meter, Refused, shown
from sunroom.network.forward import forward
from sunroom.network.handoff import HandoffListener
from sunroom.network.http import (
    BadTarget,
    absolute_target,
    authority,
    check_framing,
    error_response,
    host_header,
)
from sunroom.network.policy import Network, is_ip, parse_pattern
from sunroom.network.resolve import HostResolver, Resolver, address_refusal
from sunroom.network.tunnel import CHUNK, hold, relay_tunnel

__all__ = ["HEAD_TIMEOUT_S", "MAX_HEAD_BYTES", "Connection", "EgressProxy"]

if TYPE_CHECKING:
    from sunroom.network.ca import ProxyCA

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""The largest request (or upstream response) head the proxy reads."""
HEAD_TIMEOUT_S = 30.0
"""How long a client may take to send its request head (the slowloris defence)."""
MAX_SOCKET_PATH = 107
"""The longest Unix socket path Linux takes (``sun_path`` is 108 bytes with its NUL)."""


class EgressProxy:
    """One kernel's egress proxy, enforcing ``network`` on a Unix socket.

    ``charge(n)`` is called with every relayed chunk's size (both directions); when it returns
    False the caller's budget is spent: that connection ends and new ones are refused (429),
    with reason ``"byte budget spent"``; the policy's ``max_bytes`` is enforced the same way.
    ``on_connection`` gets one :class:`Connection` per connection when it ends or is refused;
    an exception it raises is logged with its traceback and goes no further. ``resolver``
    replaces the default (``Network.hosts``, then the loop's getaddrinfo); it is called once
    per connection to a name, and the proxy connects only to an address it checked.
    """

    def __init__(
        self,
        network: Network,
        *,
        on_connection: Callable[[Connection], None] | None = None,
        charge: Callable[[int], bool] | None = None,
        resolver: Resolver | None = None,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_head_bytes: int = MAX_HEAD_BYTES,
    ) -> None:
        if not isinstance(network, Network):
            raise UsageError("EgressProxy needs a sunroom.Network policy.")
        if head_timeout_s <= 0 or max_head_bytes <= 0:
            raise UsageError("head_timeout_s and max_head_bytes must be positive.")
        self.network = network
        self._on_connection = on_connection
        self._resolver: Resolver = resolver or HostResolver(network.hosts)
        self._address_nets = network.address_networks()
        self._head_timeout_s = head_timeout_s
        self._max_head_bytes = max_head_bytes
        self.ca_pem: bytes | None = None
        self._meter = Meter(network.max_bytes, charge)
        self._relays = relay_threads.Share()
        self.connections = 0
        self._ca: ProxyCA | None = None
        self._upstream_tls: ssl.SSLContext | None = None
        self._server: asyncio.Server | None = None
        self._handoff: HandoffListener | None = None
        self._adopting: set[asyncio.Task[None]] = set()
        self._listeners: list[asyncio.Server] = []
        self._socket_path: Path | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def bytes_total(self) -> int:
        """Bytes relayed so far, both directions, all connections (never over ``max_bytes``)."""
        return self._meter.total

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, socket_path: Path, *, handoff: bool = False) -> None:
        """Listen on ``socket_path``; a stale socket there is replaced.

        Without ``handoff`` each connection to the socket is one client connection. With it the
        socket takes TCP listeners handed over by a kernel's supervisor
        (:mod:`~sunroom.network.handoff`), and the proxy accepts the kernel's connections on
        them itself. In terminate mode the proxy's CA is made here (``ca_pem``).
        """
        if self._server is not None or self._handoff is not None or self._closed:
            raise UsageError("an EgressProxy starts once.")
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise UsageError(
                f"the proxy's socket path is over {MAX_SOCKET_PATH} bytes (a Unix socket limit)."
            )
        if self.network.tls == "terminate":
            from sunroom.network.ca import ProxyCA  # cryptography: only terminate mode needs it

            hosts = [parse_pattern(key)[0] for key in self.network.inject]
            self._ca = ProxyCA(hosts)
            self.ca_pem = self._ca.pem
            context = ssl.create_default_context()
            if self.network.ca_file is not None:
                try:
                    context.load_verify_locations(cafile=self.network.ca_file)
                except (OSError, ssl.SSLError) as exc:
                    self._ca.close()
                    raise UsageError(
                        f"ca_file {self.network.ca_file!r} is not a CA bundle."
                    ) from exc
            context.set_alpn_protocols(["http/1.1"])
            self._upstream_tls = context
        self._socket_path = Path(socket_path)
        if handoff:
            self._handoff = HandoffListener(self._adopt)
            self._handoff.start(self._socket_path)
        else:
            self._server = await asyncio.start_unix_server(
                self._accept, path=str(socket_path), limit=CHUNK
            )

    async def aclose(self) -> None:
        """Stop listening and end every open connection (each is recorded); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        if self._handoff is not None:
            self._handoff.close()
        # a listener being adopted is served, then closed below (cancelling could leak it)
        await asyncio.gather(*self._adopting, return_exceptions=True)
        for server in self._listeners:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in [*self._listeners, *([self._server] if self._server else [])]:
            await server.wait_closed()
        if self._socket_path is not None and self._socket_path.is_socket():
            self._socket_path.unlink()
        if self._ca is not None:
            self._ca.close()

    # -- one connection ----------------------------------------------------------------------

    def _adopt(self, listener: socket.socket) -> None:
        """Accept on a TCP listener handed over on the hand-off socket, as on our own socket."""
        if self._closed:
            listener.close()
            return
        task = asyncio.get_running_loop().create_task(self._serve_listener(listener))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _serve_listener(self, listener: socket.socket) -> None:
        try:
            server = await asyncio.start_server(self._accept, sock=listener, limit=CHUNK)
        except OSError:
            listener.close()
            log.warning("egress proxy: a handed-over listener could not be served", exc_info=True)
            return
        if self._closed:
            server.close()
            return
        self._listeners.append(server)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:  # a hand-off that was under way when the proxy closed
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        flow = Flow()
        try:
            if len(self._tasks) > self.network.max_connections:
                raise Refused(
                    503,
                    "too many connections",
                    f"sunroom: this kernel already has {self.network.max_connections} "
                    "connections open through its proxy (the limit); try again when one ends.",
                )
            await self._serve(flow, reader, writer)
        except Refused as refused:
            flow.reason = flow.reason or refused.reason
            with contextlib.suppress(OSError):  # the kernel may have gone already
                writer.write(error_response(refused.status, refused.sentence))
        except Ended as ended:
            flow.reason = flow.reason or ended.reason
        except asyncio.CancelledError:
            if not flow.finished:
                flow.reason = flow.reason or "proxy closed"
            raise
        except (OSError, EOFError, h11.ProtocolError) as exc:
            flow.reason = flow.reason or f"connection failed ({type(exc).__name__})"
        except Exception:
            log.exception("egress proxy: connection to %s failed", shown(flow.host, flow.port))
            flow.reason = "proxy error"
        finally:
            self._tasks.discard(task)
            for stream in (writer, flow.upstream):
                if stream is not None:
                    stream.close()
            self._record(flow)

    def _record(self, flow: Flow) -> None:
        record = flow.record()
        log.debug(
            "egress %s %s allowed=%s reason=%s sent=%d received=%d",
            record.scheme,
            shown(record.host, record.port),
            record.allowed,
            record.reason,
            record.bytes_sent,
            record.bytes_received,
        )
        if self._on_connection is None:
            return
        try:
            self._on_connection(record)
        except Exception:
            log.exception("egress proxy: the on_connection callback raised")

    def _head_too_large(self) -> Refused:
        return Refused(
            431,
            "head too large",
            f"sunroom: the request head is larger than the proxy's "
            f"{self._max_head_bytes}-byte limit.",
        )

    async def _read_head(
        self, conn: h11.Connection, reader: asyncio.StreamReader, deadline: float
    ) -> h11.Request:
        """The client's request head, parsed by h11 within ``deadline`` (loop time)."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self._parse_head(conn, reader)
        except TimeoutError:
            raise Refused(
                408,
                "head timeout",
                f"sunroom: the request head did not arrive within {self._head_timeout_s:g} s.",
            ) from None

    async def _parse_head(self, conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Request:
        fed = 0
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint == 431:
                    raise self._head_too_large() from None
                raise Refused(
                    400, "bad request", "sunroom: the proxy could not parse this request."
                ) from None
            if isinstance(event, h11.Request):
                return event
            if event is not h11.NEED_DATA:
                raise Ended("closed before a request")
            if fed >= self._max_head_bytes:
                raise self._head_too_large()
            data = await reader.read(self._max_head_bytes - fed)
            fed += len(data)
            conn.receive_data(data)

    async def _serve(
        self, flow: Flow, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_head_bytes)
        request = await self._read_head(conn, reader, loop.time() + self._head_timeout_s)
        target = request.target.decode("latin-1")
        flow.method = request.method.decode("ascii")
        try:
            if request.method == b"CONNECT":
                flow.scheme, flow.method = "https", None
                flow.host, flow.port = authority(target, default_port=None)
            else:
                flow.host, flow.port, origin = absolute_target(target)
                if host_header(request.headers, default_port=80) != (flow.host, flow.port):
                    raise BadTarget("the Host header does not name the URI's host")
                check_framing(request.headers)
        except BadTarget as bad:
            raise Refused(400, "bad request", f"sunroom: bad proxy request: {bad}.") from None
        if request.method == b"CONNECT":
            await self._connect(flow, conn, reader, writer)
        else:
            upstream = await self._open(flow, tls=False)
            await self._forward(flow, conn, request, origin, (reader, writer), upstream)

    # -- checks and upstream -----------------------------------------------------------------

    def _check(self, flow: Flow) -> None:
        where = shown(flow.host, flow.port)
        if not self.network.allows(flow.host, flow.port):
            raise Refused(
                403,
                "not in allowlist",
                f"sunroom: {where} is not in this kernel's network allowlist.",
            )
        if self._meter.spent:
            raise Refused(
                429, "byte budget spent", "sunroom: this kernel's network byte budget is spent."
            )

    async def _open(
        self, flow: Flow, *, tls: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Resolve once, check every address, connect to a checked one (connect timeout)."""
        self._check(flow)
        try:
            async with asyncio.timeout(self.network.connect_timeout_s):
                return await self._resolve_and_connect(flow, tls=tls)
        except TimeoutError:
            raise Refused(
                504,
                "connect timeout",
                f"sunroom: {shown(flow.host, flow.port)} did not answer within "
                f"{self.network.connect_timeout_s:g} s.",
            ) from None

    async def _resolve_and_connect(
        self, flow: Flow, *, tls: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = flow.host, flow.port
        if is_ip(host):
            addresses = [host]
        else:
            try:
                addresses = list(await self._resolver(host))
            except OSError:
                raise Refused(
                    502, "unresolvable", f"sunroom: the name {host} could not be resolved."
                ) from None
            if not addresses:
                raise Refused(502, "unresolvable", f"sunroom: the name {host} has no addresses.")
        for address in addresses:
            why = address_refusal(address, self._address_nets)
            if why is not None:
                raise Refused(
                    403,
                    "address not allowed",
                    f"sunroom: {host} resolves to an address this kernel may not reach ({why}).",
                )
        failure: OSError | None = None
        for address in addresses:
            try:
                stream = await asyncio.open_connection(
                    address,
                    port,
                    limit=CHUNK,
                    ssl=self._upstream_tls if tls else None,
                    server_hostname=host if tls else None,
                )
            except ssl.SSLError:
                raise Refused(
                    502,
                    "upstream tls failed",
                    f"sunroom: the TLS certificate of {host} could not be verified.",
                ) from None
            except OSError as exc:
                failure = exc
                continue
            flow.address = address
            flow.upstream = stream[1]
            return stream
        raise Refused(
            502,
            "unreachable",
            f"sunroom: {shown(host, port)} refused or could not take the connection.",
        ) from failure

    async def _connect(
        self,
        flow: Flow,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        inject = self.network.headers_for(flow.host, flow.port)
        if inject and self.network.tls == "passthrough":
            self._check(flow)
            raise Refused(
                403,
                "injection needs tls=terminate",
                f"sunroom: {shown(flow.host, flow.port)} has injected headers, which the proxy "
                'cannot add to TLS it does not terminate; use Network(tls="terminate").',
            )
        if not isinstance(conn.next_event(), h11.EndOfMessage):
            raise Refused(400, "bad request", "sunroom: a CONNECT request may not have a body.")
        if inject:
            await self._terminate(flow, conn, reader, writer, inject)
            return
        # the tunnel's bytes are relayed past the streams (tunnel.py): from here the kernel's
        # transport reads nothing more into its reader, and the upstream's none from the start
        hold(writer)
        upstream = await self._open(flow, tls=False)
        hold(upstream[1])
        flow.allowed = True
        writer.write(
            conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
        )
        early, _ = conn.trailing_data
        if early:
            self._meter.count(flow, len(early), outbound=True)
            upstream[1].write(early)
        await relay_tunnel(
            self._meter,
            flow,
            self.network.idle_timeout_s,
            (reader, writer),
            upstream,
            self._relays,
        )

    async def _terminate(
        self,
        flow: Flow,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        inject: dict[str, str],
    ) -> None:
        """Terminate the kernel's TLS and forward one request with the headers injected.

        The upstream is connected (over verified TLS) before the CONNECT is answered; the
        kernel's TLS is then taken with a leaf certificate for the host.
        """
        assert self._ca is not None
        upstream = await self._open(flow, tls=True)
        writer.write(
            conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
        )
        early, _ = conn.trailing_data
        if early:
            raise Ended("client sent data before the CONNECT was answered")
        # no await between the 200 and start_tls: the ClientHello cannot have been read yet
        await writer.start_tls(
            self._ca.server_context(flow.host),
            ssl_handshake_timeout=self.network.connect_timeout_s,
        )
        inner = h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_head_bytes)
        loop = asyncio.get_running_loop()
        request = await self._read_head(inner, reader, loop.time() + self._head_timeout_s)
        flow.method = request.method.decode("ascii")
        origin = request.target.decode("latin-1")
        try:
            if not origin.startswith("/"):
                raise BadTarget("inside the tunnel the target must be a path")
            if host_header(request.headers, default_port=443) != (flow.host, flow.port):
                raise BadTarget("the Host header does not name the CONNECT host")
            check_framing(request.headers)
        except BadTarget as bad:
            raise Refused(400, "bad request", f"sunroom: bad proxy request: {bad}.") from None
        await self._forward(flow, inner, request, origin, (reader, writer), upstream, inject)

    async def _forward(
        self,
        flow: Flow,
        conn: h11.Connection,
        request: h11.Request,
        origin: str,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        inject: dict[str, str] | None = None,
    ) -> None:
        """Forward ``request`` (see :mod:`sunroom.network.forward`) with the host's headers."""
        await forward(
            self._meter,
            flow,
            idle_s=self.network.idle_timeout_s,
            max_head_bytes=self._max_head_bytes,
            conn=conn,
            request=request,
            origin=origin,
            client=client,
            upstream=upstream,
            inject=self.network.headers_for(flow.host, flow.port) if inject is None else inject,
        )
