"""The host-side egress proxy of one kernel: HTTP CONNECT and plain HTTP forwarding.

A kernel reaches it through a Unix socket (its sandbox has no other way out). Each connection
carries one CONNECT (relayed byte for byte, or terminated with the proxy's CA when headers must
be injected over TLS) or one absolute-form plain HTTP request (forwarded in origin form with
``Connection: close``). Every connection, allowed or refused, ends in one :class:`Connection`
record. Requests are parsed with h11; nothing of the kernel's headers or the injected values
reaches a record or a log.

Limits (each with a test): ``max_connections`` concurrent connections (more get 503 at once),
a request head of at most :data:`MAX_HEAD_BYTES` (else 431) that must arrive within
``head_timeout_s`` (else 408), the policy's connect timeout (504), idle timeout and byte budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import h11

from sunroom.errors import UsageError
from sunroom.network.http import (
    BadTarget,
    absolute_target,
    authority,
    error_response,
    forward_headers,
    host_header,
)
from sunroom.network.policy import Network, is_ip, parse_pattern
from sunroom.network.resolve import HostResolver, Resolver, address_refusal

__all__ = ["HEAD_TIMEOUT_S", "MAX_HEAD_BYTES", "Connection", "EgressProxy"]

if TYPE_CHECKING:
    from sunroom.network.ca import ProxyCA

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""The largest request (or upstream response) head the proxy reads."""
HEAD_TIMEOUT_S = 30.0
"""How long a client may take to send its request head (the slowloris defence)."""
CHUNK = 256 * 1024
"""Bytes read per relay step."""
MAX_SOCKET_PATH = 107
"""The longest Unix socket path Linux takes (``sun_path`` is 108 bytes with its NUL)."""


@dataclass(frozen=True, slots=True)
class Connection:
    """One connection through the proxy, allowed or refused, recorded when it ends.

    ``bytes_sent`` went kernel -> upstream and ``bytes_received`` upstream -> kernel (the
    payload relayed; for forwarded requests, the messages as written and read upstream).
    ``reason`` says why it was refused or ended early (None: it ran and ended normally).
    ``injected`` says headers were injected, never which. ``method`` is the plain HTTP (or
    terminated HTTPS) method; None for a CONNECT relayed as is.
    """

    host: str
    port: int
    scheme: str
    allowed: bool
    reason: str | None
    address: str | None
    bytes_sent: int
    bytes_received: int
    duration_s: float
    injected: bool
    method: str | None


class _Refused(Exception):
    """A refusal answered with ``status`` and a one-sentence body."""

    def __init__(self, status: int, reason: str, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status
        self.reason = reason
        self.sentence = sentence


class _Ended(Exception):
    """The connection must end early; ``reason`` goes into its record."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Flow:
    """The mutable state of one connection, frozen into a :class:`Connection` at the end."""

    def __init__(self) -> None:
        self.host = ""
        self.port = 0
        self.scheme = "http"
        self.allowed = False
        self.reason: str | None = None
        self.address: str | None = None
        self.sent = 0
        self.received = 0
        self.injected = False
        self.method: str | None = None
        self.started = time.monotonic()
        self.active = asyncio.get_running_loop().time()
        self.upstream: asyncio.StreamWriter | None = None
        self.finished = False

    def record(self) -> Connection:
        return Connection(
            host=self.host,
            port=self.port,
            scheme=self.scheme,
            allowed=self.allowed,
            reason=self.reason,
            address=self.address,
            bytes_sent=self.sent,
            bytes_received=self.received,
            duration_s=time.monotonic() - self.started,
            injected=self.injected,
            method=self.method,
        )


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _resend(event: object, conn: h11.Connection, cut_off: str) -> bytes:
    """``event`` (a response head or a body part) serialized again by ``conn``.

    Response heads lose their hop-by-hop headers and gain ``Connection: close``; any other
    event (the peer closed early) ends the connection with ``cut_off`` as the reason.
    """
    if isinstance(event, h11.Data):
        out = conn.send(h11.Data(data=event.data))
    elif isinstance(event, h11.EndOfMessage):
        out = conn.send(h11.EndOfMessage())
    elif isinstance(event, h11.InformationalResponse):
        out = conn.send(
            h11.InformationalResponse(
                status_code=event.status_code,
                headers=forward_headers(event.headers, {})[:-1],
                reason=event.reason,
            )
        )
    elif isinstance(event, h11.Response):
        out = conn.send(
            h11.Response(
                status_code=event.status_code,
                headers=forward_headers(event.headers, {}),
                reason=event.reason,
            )
        )
    else:
        raise _Ended(cut_off)
    return out or b""


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
        self._charge = charge
        self._resolver: Resolver = resolver or HostResolver(network.hosts)
        self._address_nets = network.address_networks()
        self._head_timeout_s = head_timeout_s
        self._max_head_bytes = max_head_bytes
        self.ca_pem: bytes | None = None
        self.bytes_total = 0
        self.connections = 0
        self._ca: ProxyCA | None = None
        self._upstream_tls: ssl.SSLContext | None = None
        self._server: asyncio.Server | None = None
        self._socket_path: Path | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._spent = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, socket_path: Path) -> None:
        """Listen on ``socket_path``; a stale socket there is replaced.

        In terminate mode the proxy's CA is made here (``ca_pem``).
        """
        if self._server is not None or self._closed:
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
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._socket_path is not None and self._socket_path.is_socket():
            self._socket_path.unlink()
        if self._ca is not None:
            self._ca.close()

    # -- one connection ----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        flow = _Flow()
        try:
            if len(self._tasks) > self.network.max_connections:
                raise _Refused(
                    503,
                    "too many connections",
                    f"sunroom: this kernel already has {self.network.max_connections} "
                    "connections open through its proxy (the limit); try again when one ends.",
                )
            await self._serve(flow, reader, writer)
        except _Refused as refused:
            flow.reason = flow.reason or refused.reason
            with contextlib.suppress(OSError):  # the kernel may have gone already
                writer.write(error_response(refused.status, refused.sentence))
        except _Ended as ended:
            flow.reason = flow.reason or ended.reason
        except asyncio.CancelledError:
            if not flow.finished:
                flow.reason = flow.reason or "proxy closed"
            raise
        except (OSError, EOFError, h11.ProtocolError) as exc:
            flow.reason = flow.reason or f"connection failed ({type(exc).__name__})"
        except Exception:
            log.exception("egress proxy: connection to %s failed", _shown(flow.host, flow.port))
            flow.reason = "proxy error"
        finally:
            self._tasks.discard(task)
            for stream in (writer, flow.upstream):
                if stream is not None:
                    stream.close()
            self._record(flow)

    def _record(self, flow: _Flow) -> None:
        record = flow.record()
        log.debug(
            "egress %s %s allowed=%s reason=%s sent=%d received=%d",
            record.scheme,
            _shown(record.host, record.port),
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

    def _head_too_large(self) -> _Refused:
        return _Refused(
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
            raise _Refused(
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
                raise _Refused(
                    400, "bad request", "sunroom: the proxy could not parse this request."
                ) from None
            if isinstance(event, h11.Request):
                return event
            if event is not h11.NEED_DATA:
                raise _Ended("closed before a request")
            if fed >= self._max_head_bytes:
                raise self._head_too_large()
            data = await reader.read(self._max_head_bytes - fed)
            fed += len(data)
            conn.receive_data(data)

    async def _serve(
        self, flow: _Flow, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
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
        except BadTarget as bad:
            raise _Refused(400, "bad request", f"sunroom: bad proxy request: {bad}.") from None
        if request.method == b"CONNECT":
            await self._connect(flow, conn, reader, writer)
        else:
            upstream = await self._open(flow, tls=False)
            await self._forward(flow, conn, request, origin, reader, writer, upstream)

    # -- checks and upstream -----------------------------------------------------------------

    def _check(self, flow: _Flow) -> None:
        where = _shown(flow.host, flow.port)
        if not self.network.allows(flow.host, flow.port):
            raise _Refused(
                403,
                "not in allowlist",
                f"sunroom: {where} is not in this kernel's network allowlist.",
            )
        if self._spent:
            raise _Refused(
                429, "byte budget spent", "sunroom: this kernel's network byte budget is spent."
            )

    async def _open(
        self, flow: _Flow, *, tls: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Resolve once, check every address, connect to a checked one (connect timeout)."""
        self._check(flow)
        try:
            async with asyncio.timeout(self.network.connect_timeout_s):
                return await self._resolve_and_connect(flow, tls=tls)
        except TimeoutError:
            raise _Refused(
                504,
                "connect timeout",
                f"sunroom: {_shown(flow.host, flow.port)} did not answer within "
                f"{self.network.connect_timeout_s:g} s.",
            ) from None

    async def _resolve_and_connect(
        self, flow: _Flow, *, tls: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = flow.host, flow.port
        if is_ip(host):
            addresses = [host]
        else:
            try:
                addresses = list(await self._resolver(host))
            except OSError:
                raise _Refused(
                    502, "unresolvable", f"sunroom: the name {host} could not be resolved."
                ) from None
            if not addresses:
                raise _Refused(502, "unresolvable", f"sunroom: the name {host} has no addresses.")
        for address in addresses:
            why = address_refusal(address, self._address_nets)
            if why is not None:
                raise _Refused(
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
                raise _Refused(
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
        raise _Refused(
            502,
            "unreachable",
            f"sunroom: {_shown(host, port)} refused or could not take the connection.",
        ) from failure

    # -- relaying ----------------------------------------------------------------------------

    def _count(self, flow: _Flow, n: int, *, outbound: bool) -> None:
        """Charge ``n`` relayed bytes; raise ``_Ended`` (not relaying them) if over budget."""
        limit = self.network.max_bytes
        if (
            self._spent
            or (limit is not None and self.bytes_total + n > limit)
            or (self._charge is not None and not self._charge(n))
        ):
            self._spent = True
            raise _Ended("byte budget spent")
        self.bytes_total += n
        if outbound:
            flow.sent += n
        else:
            flow.received += n
        flow.active = asyncio.get_running_loop().time()

    async def _pump(
        self,
        flow: _Flow,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        *,
        outbound: bool,
    ) -> None:
        """Copy until ``source`` ends, then half-close ``sink``."""
        while data := await source.read(CHUNK):
            self._count(flow, len(data), outbound=outbound)
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            with contextlib.suppress(OSError):
                sink.write_eof()

    async def _supervise(
        self, flow: _Flow, mains: list[Awaitable[object]], sides: list[Awaitable[object]]
    ) -> None:
        """Run ``mains`` and ``sides`` as tasks until every main one ends.

        Under the idle timeout; a failure of any ends them all (the caller closes the streams).
        """
        loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(work) for work in (*mains, *sides)]
        main_tasks = set(tasks[: len(mains)])
        idle = self.network.idle_timeout_s
        expired = False
        timer: asyncio.TimerHandle | None = None

        def check_idle() -> None:
            nonlocal expired, timer
            if loop.time() >= flow.active + idle:
                expired = True
                for task in tasks:
                    task.cancel()
            else:
                timer = loop.call_at(flow.active + idle, check_idle)

        timer = loop.call_at(flow.active + idle, check_idle)
        try:
            pending = set(tasks)
            while pending & main_tasks:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if expired:
                    raise _Ended("idle timeout")
                for task in done:
                    task.result()  # a failed side task ends the connection too
            flow.finished = True
        finally:
            if timer is not None:
                timer.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _connect(
        self,
        flow: _Flow,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        inject = self.network.headers_for(flow.host, flow.port)
        if inject and self.network.tls == "passthrough":
            self._check(flow)
            raise _Refused(
                403,
                "injection needs tls=terminate",
                f"sunroom: {_shown(flow.host, flow.port)} has injected headers, which the proxy "
                'cannot add to TLS it does not terminate; use Network(tls="terminate").',
            )
        if not isinstance(conn.next_event(), h11.EndOfMessage):
            raise _Refused(400, "bad request", "sunroom: a CONNECT request may not have a body.")
        if inject:
            await self._terminate(flow, conn, reader, writer, inject)
            return
        up_reader, up_writer = await self._open(flow, tls=False)
        flow.allowed = True
        writer.write(
            conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
        )
        early, _ = conn.trailing_data
        if early:
            self._count(flow, len(early), outbound=True)
            up_writer.write(early)
        await self._supervise(
            flow,
            [
                self._pump(flow, reader, up_writer, outbound=True),
                self._pump(flow, up_reader, writer, outbound=False),
            ],
            [],
        )

    async def _terminate(
        self,
        flow: _Flow,
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
            raise _Ended("client sent data before the CONNECT was answered")
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
        except BadTarget as bad:
            raise _Refused(400, "bad request", f"sunroom: bad proxy request: {bad}.") from None
        await self._forward(flow, inner, request, origin, reader, writer, upstream, inject)

    async def _forward(
        self,
        flow: _Flow,
        conn: h11.Connection,
        request: h11.Request,
        origin: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        inject: dict[str, str] | None = None,
    ) -> None:
        """Send ``request`` upstream in origin form and stream the body and the answer."""
        if inject is None:
            inject = self.network.headers_for(flow.host, flow.port)
        flow.allowed = True
        flow.injected = bool(inject)
        up_reader, up_writer = upstream
        client = h11.Connection(h11.CLIENT, max_incomplete_event_size=self._max_head_bytes)
        head = client.send(
            h11.Request(
                method=request.method,
                target=origin.encode("latin-1"),
                headers=forward_headers(request.headers, inject),
            )
        )
        self._count(flow, len(head), outbound=True)
        up_writer.write(head)
        await self._supervise(
            flow,
            [self._relay_response(flow, conn, writer, client, up_reader)],
            [self._relay_body(flow, conn, reader, client, up_writer)],
        )

    async def _relay_body(
        self,
        flow: _Flow,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        client: h11.Connection,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(CHUNK))
                continue
            if isinstance(event, h11.Request | h11.InformationalResponse | h11.Response):
                raise _Ended("the request body was cut off")
            out = _resend(event, client, "the request body was cut off")
            if out:
                self._count(flow, len(out), outbound=True)
                up_writer.write(out)
                await up_writer.drain()
            if isinstance(event, h11.EndOfMessage):
                return

    async def _relay_response(
        self,
        flow: _Flow,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        client: h11.Connection,
        up_reader: asyncio.StreamReader,
    ) -> None:
        while True:
            try:
                event = client.next_event()
            except h11.RemoteProtocolError:
                raise _Ended("the upstream broke HTTP") from None
            if event is h11.NEED_DATA:
                data = await up_reader.read(CHUNK)
                if data:
                    self._count(flow, len(data), outbound=False)
                client.receive_data(data)
                continue
            out = _resend(event, conn, "the upstream closed before its answer ended")
            if out:
                writer.write(out)
                await writer.drain()
            if isinstance(event, h11.EndOfMessage):
                return
