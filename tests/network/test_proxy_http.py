"""Plain HTTP through the egress proxy: forwarding, injection, and the request checks."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from sunroom.network import Connection

from .upstream import ask, get, loopback, running, tunnel, upstream

pytestmark = pytest.mark.usefixtures("way_in")

SECRET = "Bearer sk-plain-http-secret"


async def test_allowed_get_is_forwarded_in_origin_form_with_hop_by_hop_dropped() -> None:
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net, on_connection=records.append) as (proxy, sock):
            answer = await ask(
                sock,
                get(
                    "api.test",
                    up.port,
                    "/echo?q=1",
                    "Proxy-Authorization: Basic abc\r\nProxy-Connection: keep-alive\r\n"
                    "Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n",
                ),
            )
    assert answer.status == 200
    assert answer.headers["connection"] == "close"
    assert json.loads(answer.body)["target"] == "/echo?q=1"
    names = [n for n, _ in up.seen[0].headers]
    assert "proxy-authorization" not in names and "proxy-connection" not in names
    assert "x-drop" not in names and up.header(0, "x-keep") == ["2"]
    assert up.header(0, "connection") == ["close"]
    assert up.seen[0].peer == "127.0.0.1"
    [record] = records
    assert record.allowed and record.reason is None and record.scheme == "http"
    assert record.method == "GET" and record.address == "127.0.0.1"
    assert record.host == "api.test" and record.port == up.port
    assert record.bytes_sent > 0 and record.bytes_received > len(answer.body)
    assert proxy.bytes_total == record.bytes_sent + record.bytes_received
    assert proxy.connections == 1


async def test_post_bodies_stream_with_content_length_and_chunked() -> None:
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net) as (_, sock):
            body = b"y" * 300_000
            head = f"POST http://api.test:{up.port}/echo HTTP/1.1\r\nHost: api.test:{up.port}\r\n"
            fixed = await ask(sock, f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:1000], body[1000:]))
            chunked = await ask(
                sock, f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + chunks + b"0\r\n\r\n"
            )
    assert json.loads(fixed.body)["body"] == len(body)
    assert json.loads(chunked.body)["body"] == len(body)
    assert up.header(1, "transfer-encoding") == ["chunked"]


BOTH = b"Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
"""A request body framed two ways: 5 bytes chunked, and a length of 100 that never comes."""


async def test_a_request_with_both_content_length_and_chunked_is_refused() -> None:
    # RFC 9112, 6.1: forwarded as it was, an upstream that trusted the length would wait for
    # 100 bytes that never come (or read what follows as a second request)
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net, on_connection=records.append) as (_, sock):
            head = f"POST http://api.test:{up.port}/echo HTTP/1.1\r\nHost: api.test:{up.port}\r\n"
            answer = await ask(sock, head.encode() + BOTH)
            # the same headers the other way round, and in another case
            swapped = head.encode() + b"transfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n"
            other = await ask(sock, swapped + b"5\r\nhello\r\n0\r\n\r\n")
    assert answer.status == 400 and other.status == 400
    assert answer.body == (
        b"sunroom: bad proxy request: a request must not have both Transfer-Encoding and "
        b"Content-Length (RFC 9112, 6.1).\n"
    )
    assert up.seen == []  # never forwarded
    assert [r.reason for r in records] == ["bad request", "bad request"]


async def test_a_response_with_both_content_length_and_chunked_loses_its_length() -> None:
    # pins what the kernel gets: h11, writing the answer, drops the length as well
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net) as (_, sock):
            answer = await ask(sock, get("api.test", up.port, "/both"))
    assert answer.status == 200 and answer.body == b"hello"
    assert "content-length" not in answer.headers  # RFC 9112, 6.3: the intermediary drops it
    assert answer.headers["transfer-encoding"] == "chunked"


async def test_a_chunked_download_streams_back() -> None:
    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net) as (_, sock):
            answer = await ask(sock, get("api.test", up.port, "/chunked/200000"))
    assert answer.status == 200 and len(answer.body) == 200_000


async def test_injected_headers_replace_the_kernels_and_are_never_recorded() -> None:
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback(
            "api.test",
            allow=[f"api.test:{up.port}"],
            inject={f"api.test:{up.port}": {"Authorization": SECRET}},
        )
        async with running(net, on_connection=records.append) as (_, sock):
            answer = await ask(
                sock, get("api.test", up.port, extra="authorization: Bearer kernel-forged\r\n")
            )
    assert answer.status == 200
    assert up.header(0, "authorization") == [SECRET]
    [record] = records
    assert record.injected
    assert SECRET not in repr(record) and SECRET not in answer.body.decode()


async def test_refusals_answer_one_clear_sentence() -> None:
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback(
            "api.test", "private.test", allow=[f"api.test:{up.port}", "private.test", "10.1.2.3"]
        )
        net = type(net)(
            **{**net.to_json(), "hosts": {"api.test": "127.0.0.1", "private.test": "10.1.2.3"}}
        )
        async with running(net, on_connection=records.append) as (_, sock):
            refused = await ask(sock, get("evil.test", 443))
            raw_ip = await ask(sock, get("127.0.0.1", up.port))
            private = await ask(sock, get("private.test", 80))
            literal = await ask(sock, get("10.1.2.3", 80))
            mismatch = await ask(
                sock,
                f"GET http://api.test:{up.port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode(),
            )
            origin = await ask(
                sock, f"GET /echo HTTP/1.1\r\nHost: api.test:{up.port}\r\n\r\n".encode()
            )
            https_uri = await ask(
                sock,
                f"GET https://api.test:{up.port}/ HTTP/1.1\r\nHost: api.test:{up.port}\r\n\r\n".encode(),
            )
            garbage = await ask(sock, b"NOT HTTP AT ALL\r\n\r\n")
    assert refused.status == 403
    assert refused.body == b"sunroom: evil.test:443 is not in this kernel's network allowlist.\n"
    assert raw_ip.status == 403  # an IP literal is reached only if listed exactly
    assert private.status == 403 and b"not a public address" in private.body
    assert literal.status == 403 and b"not a public address" in literal.body
    assert mismatch.status == 400 and b"Host header" in mismatch.body
    assert origin.status == 400 and b"absolute URI" in origin.body
    assert https_uri.status == 400
    assert garbage.status == 400
    assert up.seen == []  # nothing reached the upstream
    reasons = [r.reason for r in records]
    assert reasons[:4] == [
        "not in allowlist",
        "not in allowlist",
        "address not allowed",
        "address not allowed",
    ]
    assert all(not r.allowed for r in records)


async def test_resolution_happens_once_and_the_checked_address_is_used() -> None:
    calls: list[str] = []

    async def rebinding(host: str) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["10.9.9.9"]

    async def mixed(host: str) -> list[str]:
        return ["127.0.0.1", "192.168.1.1"]

    records: list[Connection] = []
    async with upstream() as up:
        net = loopback(allow=[f"rebind.test:{up.port}"])
        async with running(net, resolver=rebinding, on_connection=records.append) as (_, sock):
            first = await ask(sock, get("rebind.test", up.port))
            second = await ask(sock, get("rebind.test", up.port))
        async with running(net, resolver=mixed) as (_, sock):
            both = await ask(sock, get("rebind.test", up.port))
    assert first.status == 200 and records[0].address == "127.0.0.1"
    assert second.status == 403 and b"10.9.9.9" in second.body
    assert calls == ["rebind.test", "rebind.test"]  # one resolution per connection
    assert len(up.seen) == 1
    assert both.status == 403 and b"192.168.1.1" in both.body


async def test_a_resolver_failure_is_a_502() -> None:
    async def broken(host: str) -> list[str]:
        raise OSError("no such name")

    async with running(loopback(allow=["gone.test"]), resolver=broken) as (_, sock):
        answer = await ask(sock, get("gone.test", 80))
    assert (
        answer.status == 502
        and answer.body == b"sunroom: the name gone.test could not be resolved.\n"
    )


async def test_an_on_connection_callback_that_raises_does_not_hurt_the_proxy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bad(record: Connection) -> None:
        raise RuntimeError("callback bug")

    async with upstream() as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net, on_connection=bad) as (_, sock):
            one = await ask(sock, get("api.test", up.port))
            two = await ask(sock, get("api.test", up.port))
    assert one.status == two.status == 200
    assert "on_connection callback raised" in caplog.text


async def test_an_unreachable_port_is_a_502() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    async with running(loopback("api.test", allow=[f"api.test:{port}"])) as (_, sock):
        answer = await ask(sock, get("api.test", port))
    assert answer.status == 502


async def test_no_log_line_or_record_holds_an_injected_value_or_a_kernel_header(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="sunroom")
    records: list[Connection] = []
    async with upstream() as up:
        net = loopback(
            "api.test",
            allow=[f"api.test:{up.port}", "api.test"],
            inject={f"api.test:{up.port}": {"Authorization": SECRET}, "api.test": {"X-K": SECRET}},
        )
        async with running(net, on_connection=records.append) as (_, sock):
            kernel_header = "X-Kernel-Token: kt-private-123\r\n"
            ok = await ask(sock, get("api.test", up.port, extra=kernel_header))
            refused, _, _ = await tunnel(sock, "api.test", 443)  # inject over passthrough TLS
            unreachable = await ask(sock, get("api.test", 80, extra=kernel_header))
    assert ok.status == 200 and refused.status == 403 and unreachable.status == 502
    assert caplog.records  # the proxy did log
    text = caplog.text + repr(records) + refused.body.decode() + unreachable.body.decode()
    assert SECRET not in text and "kt-private-123" not in text
