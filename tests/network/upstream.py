"""Real loopback parts for the proxy tests: an HTTP(S) upstream on 127.0.0.1 and clients.

The upstream is an asyncio server speaking HTTP/1.1 through h11 (one request per
connection). Paths: ``/echo`` answers JSON with the method, target, headers and body size it
saw; ``/bytes/N`` streams N bytes; ``/chunked/N`` streams N bytes chunked; ``/both`` answers
``hello`` chunked with a ``Content-Length: 1000`` as well; ``/hang`` reads the request and never
answers. Every request it saw is kept in ``seen``.

Clients reach a proxy started by :func:`running` one of two ways (:data:`WAY_IN`, set per test
by the ``way_in`` fixture of ``tests/network/conftest.py``): ``"unix"``, a connection to the
proxy's own Unix socket, or ``"handoff"``, as a kernel does: a TCP listener on 127.0.0.1 is
handed to the proxy over its hand-off socket and clients connect to that port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import h11

from sunroom.network import EgressProxy, Network
from sunroom.network.ca import ProxyCA
from sunroom.prelude import egress

WAY_IN = {"mode": "unix"}
"""How clients reach the proxy: ``"unix"`` or ``"handoff"`` (see the module docstring)."""
_PORTS: dict[Path, int] = {}


@dataclass
class Seen:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: int
    peer: str


@dataclass
class Upstream:
    port: int
    seen: list[Seen] = field(default_factory=list)
    handlers: set[asyncio.Task[None]] = field(default_factory=set)

    def header(self, index: int, name: str) -> list[str]:
        return [v for n, v in self.seen[index].headers if n == name.lower()]


async def _answer(up: Upstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = h11.Connection(h11.SERVER)
    request: h11.Request | None = None
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            size += len(event.data)
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            writer.close()
            return
    assert request is not None
    peer = writer.get_extra_info("peername")[0]
    target = request.target.decode()
    up.seen.append(
        Seen(
            request.method.decode(),
            target,
            [(n.decode(), v.decode()) for n, v in request.headers],
            size,
            peer,
        )
    )
    if target == "/both":  # a response framed two ways (RFC 9112 forbids it): chunked wins
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n"
        )
        await writer.drain()
        writer.close()
        return
    if target == "/hang":  # never answer; end when the proxy hangs up
        await reader.read()
        writer.close()
        return
    if target.startswith(("/bytes/", "/chunked/")):
        total = int(target.rsplit("/", 1)[1])
        framing = (
            [("content-length", str(total))]
            if target.startswith("/bytes/")
            else [("transfer-encoding", "chunked")]
        )
        writer.write(conn.send(h11.Response(status_code=200, headers=framing)))
        block = b"x" * 65536
        sent = 0
        while sent < total:
            piece = block[: min(65536, total - sent)]
            writer.write(conn.send(h11.Data(data=piece)))
            sent += len(piece)
            await writer.drain()
    else:
        body = json.dumps(
            {"method": request.method.decode(), "target": target, "body": size}
        ).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
        writer.write(conn.send(h11.Response(status_code=200, headers=headers)))
        writer.write(conn.send(h11.Data(data=body)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
    writer.close()


async def _serve(up: Upstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    task = asyncio.current_task()
    assert task is not None
    up.handlers.add(task)
    try:
        await _answer(up, reader, writer)
    except (ConnectionError, h11.ProtocolError, ssl.SSLError):
        pass  # the proxy cut the connection (a budget, a timeout, aclose)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


@asynccontextmanager
async def upstream(tls: ssl.SSLContext | None = None) -> AsyncIterator[Upstream]:
    """An HTTP (or, with ``tls``, HTTPS) server on 127.0.0.1 at a free port."""
    up = Upstream(port=0)
    server = await asyncio.start_server(lambda r, w: _serve(up, r, w), "127.0.0.1", 0, ssl=tls)
    up.port = server.sockets[0].getsockname()[1]
    try:
        async with server:
            yield up
    finally:  # every connection has ended and been closed before the loop may close
        await asyncio.wait_for(asyncio.gather(*up.handlers), 10)


class UpstreamCA:
    """A CA for the test upstreams (the proxy's CA class, used here as any CA would be)."""

    def __init__(self, *hosts: str) -> None:
        self.ca = ProxyCA(list(hosts))
        self.dir = Path(tempfile.mkdtemp(prefix="sr-ca-"))
        self.file = self.dir / "ca.pem"
        self.file.write_bytes(self.ca.pem)

    def server(self, host: str) -> ssl.SSLContext:
        return self.ca.server_context(host)

    def close(self) -> None:
        self.file.unlink()
        self.dir.rmdir()
        self.ca.close()


@asynccontextmanager
async def running(
    network: Network, *, way_in: str | None = None, hand_listener: bool = True, **kwargs: object
) -> AsyncIterator[tuple[EgressProxy, Path]]:
    """A started proxy on a short socket path; closed (and checked closed) after.

    ``way_in`` overrides :data:`WAY_IN`; with ``hand_listener=False`` a hand-off proxy gets no
    listener (the test hands over its own).
    """
    where = Path(tempfile.mkdtemp(prefix="sr-px-"))
    sock = where / "proxy.sock"
    proxy = EgressProxy(network, **kwargs)  # type: ignore[arg-type]
    handoff = (way_in or WAY_IN["mode"]) == "handoff"
    await proxy.start(sock, handoff=handoff)
    if handoff and hand_listener:
        with egress.listen(0) as listener:  # as a kernel's supervisor: bind, hand over, close
            await asyncio.to_thread(egress.hand_over, listener, str(sock))
            _PORTS[sock] = listener.getsockname()[1]  # connections queue until it is adopted
    try:
        yield proxy, sock
    finally:
        await proxy.aclose()
        assert not sock.exists()
        where.rmdir()  # noqa: ASYNC240
        port = _PORTS.pop(sock, None)
        if port is not None:  # the proxy held the only copy of the listener: the port is free
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            except ConnectionRefusedError:
                pass
            else:
                raise AssertionError("the handed-over listener outlived its proxy")


async def connect(sock: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection to the proxy started at ``sock`` (either way in)."""
    port = _PORTS.get(sock)
    if port is None:
        return await asyncio.open_unix_connection(str(sock))
    return await asyncio.open_connection("127.0.0.1", port)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def read_answer(reader: asyncio.StreamReader, *, method: bytes = b"GET") -> Answer:
    """Parse one HTTP response (h11) until its end."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=method, target=b"/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    status, body = 0, bytearray()
    headers: dict[str, str] = {}
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:  # closed without (all of) an answer
            return Answer(status, headers, bytes(body))
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
            headers = {n.decode(): v.decode() for n, v in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return Answer(status, headers, bytes(body))


async def ask(sock: Path, raw: bytes, *, method: bytes = b"GET") -> Answer:
    """Send ``raw`` bytes to the proxy and parse its one answer."""
    reader, writer = await connect(sock)
    try:
        writer.write(raw)
        await writer.drain()
        return await read_answer(reader, method=method)
    finally:
        writer.close()


async def tunnel(
    sock: Path, host: str, port: int
) -> tuple[Answer, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a CONNECT; return the answer head and the open streams."""
    reader, writer = await connect(sock)
    writer.write(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=b"CONNECT", target=b"x:1", headers=[("host", "x:1")]))
    conn.send(h11.EndOfMessage())
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.readuntil(b"\r\n\r\n"))
        elif isinstance(event, h11.Response):
            if event.status_code != 200:
                answer = await read_rest(conn, reader, event)
                writer.close()
                return answer, reader, writer
            return Answer(200, {}, b""), reader, writer


async def read_rest(
    conn: h11.Connection, reader: asyncio.StreamReader, head: h11.Response
) -> Answer:
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Data):
            body += event.data
        else:
            return Answer(
                head.status_code, {n.decode(): v.decode() for n, v in head.headers}, bytes(body)
            )


def get(host: str, port: int, path: str = "/echo", extra: str = "") -> bytes:
    """A plain absolute-form GET for the proxy."""
    return f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}\r\n".encode()


def loopback(*names: str, **kwargs: object) -> Network:
    """A policy mapping ``names`` to 127.0.0.1 with loopback allowed (tests only)."""
    return Network(
        hosts=dict.fromkeys(names, "127.0.0.1"),
        allow_addresses=("127.0.0.1/32",),
        **kwargs,  # type: ignore[arg-type]
    )
