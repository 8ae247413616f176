"""Forwarding one HTTP request upstream in origin form and streaming its answer back.

Used for plain ``http://`` requests and for the one request read inside a terminated TLS
tunnel. The request's hop-by-hop and ``Proxy-*`` headers are dropped and the injected ones set
(:func:`sunroom.network.http.forward_headers`); both messages are re-serialized by h11 with
``Connection: close``; every message part written or read upstream is charged to the meter.
"""

from __future__ import annotations

import asyncio

import h11

from sunroom.network.flow import Ended, Flow, Meter
from sunroom.network.http import forward_headers
from sunroom.network.tunnel import CHUNK, supervise

__all__ = ["forward"]


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
        raise Ended(cut_off)
    return out or b""


async def forward(
    meter: Meter,
    flow: Flow,
    *,
    idle_s: float,
    max_head_bytes: int,
    conn: h11.Connection,
    request: h11.Request,
    origin: str,
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    inject: dict[str, str],
) -> None:
    """Send ``request`` upstream as ``origin`` with ``inject`` set; stream body and answer.

    ``conn`` is the h11 server side that parsed ``request`` from ``client``.
    """
    flow.allowed = True
    flow.injected = bool(inject)
    reader, writer = client
    up_reader, up_writer = upstream
    upstream_conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head_bytes)
    head = upstream_conn.send(
        h11.Request(
            method=request.method,
            target=origin.encode("latin-1"),
            headers=forward_headers(request.headers, inject),
        )
    )
    meter.count(flow, len(head), outbound=True)
    up_writer.write(head)
    await supervise(
        flow,
        idle_s,
        [_relay_response(meter, flow, conn, writer, upstream_conn, up_reader)],
        [_relay_body(meter, flow, conn, reader, upstream_conn, up_writer)],
    )


async def _relay_body(
    meter: Meter,
    flow: Flow,
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    upstream_conn: h11.Connection,
    up_writer: asyncio.StreamWriter,
) -> None:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(CHUNK))
            continue
        if isinstance(event, h11.Request | h11.InformationalResponse | h11.Response):
            raise Ended("the request body was cut off")
        out = _resend(event, upstream_conn, "the request body was cut off")
        if out:
            meter.count(flow, len(out), outbound=True)
            up_writer.write(out)
            await up_writer.drain()
        if isinstance(event, h11.EndOfMessage):
            return


async def _relay_response(
    meter: Meter,
    flow: Flow,
    conn: h11.Connection,
    writer: asyncio.StreamWriter,
    upstream_conn: h11.Connection,
    up_reader: asyncio.StreamReader,
) -> None:
    while True:
        try:
            event = upstream_conn.next_event()
        except h11.RemoteProtocolError:
            raise Ended("the upstream broke HTTP") from None
        if event is h11.NEED_DATA:
            data = await up_reader.read(CHUNK)
            if data:
                meter.count(flow, len(data), outbound=False)
            upstream_conn.receive_data(data)
            continue
        out = _resend(event, conn, "the upstream closed before its answer ended")
        if out:
            writer.write(out)
            await writer.drain()
        if isinstance(event, h11.EndOfMessage):
            return
