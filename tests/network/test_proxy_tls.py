"""CONNECT through the egress proxy: passthrough TLS, terminate mode with injection, IPv6."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunroom.network import Connection, Network, ca_bundle

from .upstream import UpstreamCA, loopback, read_answer, running, tunnel, upstream

pytestmark = pytest.mark.usefixtures("way_in")

SECRET = "Bearer sk-tls-secret"


@pytest.fixture
def test_ca() -> Iterator[UpstreamCA]:
    ca = UpstreamCA("api.test", "plain.test")
    yield ca
    ca.close()


def _client(cadata: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=cadata.decode())
    return context


async def _https_get(
    sock: Path, host: str, port: int, trust: bytes, extra: str = ""
) -> tuple[int, dict[str, object]]:
    head, reader, writer = await tunnel(sock, host, port)
    assert head.status == 200, head.body
    await writer.start_tls(_client(trust), server_hostname=host)
    writer.write(f"GET /echo HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}\r\n".encode())
    answer = await read_answer(reader)
    writer.close()
    return answer.status, json.loads(answer.body)


async def test_allowed_connect_relays_tls_end_to_end(test_ca: UpstreamCA) -> None:
    records: list[Connection] = []
    async with upstream(test_ca.server("api.test")) as up:
        net = loopback("api.test", allow=[f"api.test:{up.port}"])
        async with running(net, on_connection=records.append) as (proxy, sock):
            status, body = await _https_get(sock, "api.test", up.port, test_ca.ca.pem)
            assert proxy.ca_pem is None
    assert status == 200 and body["target"] == "/echo"
    [record] = records
    assert record.scheme == "https" and record.allowed and record.method is None
    assert record.bytes_sent > 200 and record.bytes_received > 200  # TLS records both ways
    assert not record.injected


async def test_connect_refusals(test_ca: UpstreamCA) -> None:
    async with upstream(test_ca.server("api.test")) as up:
        net = loopback(
            "api.test",
            allow=[f"api.test:{up.port}", "[::1]:443", "10.0.0.8:443"],
            inject={f"api.test:{up.port}": {"Authorization": SECRET}},
        )
        async with running(net) as (_, sock):
            inject, _, _ = await tunnel(sock, "api.test", up.port)
            evil, _, _ = await tunnel(sock, "evil.test", 443)
            v6_listed, _, _ = await tunnel(sock, "[::1]", 443)
            v6_other, _, _ = await tunnel(sock, "[::2]", 443)
            private, _, _ = await tunnel(sock, "10.0.0.8", 443)
            no_port, _, _ = await tunnel(sock, "api.test", 0)
    assert inject.status == 403 and b'Network(tls="terminate")' in inject.body
    assert SECRET.encode() not in inject.body
    assert evil.status == 403 and b"evil.test:443 is not in" in evil.body
    assert v6_listed.status == 403 and b"not a public address" in v6_listed.body
    assert v6_other.status == 403 and b"[::2]:443 is not in" in v6_other.body
    assert private.status == 403 and b"not a public address" in private.body
    assert no_port.status == 400
    assert up.seen == []


async def test_terminate_mode_injects_over_tls_and_leaves_other_hosts_alone(
    test_ca: UpstreamCA,
) -> None:
    records: list[Connection] = []
    async with (
        upstream(test_ca.server("api.test")) as api,
        upstream(test_ca.server("plain.test")) as plain,
    ):
        net = loopback(
            "api.test",
            "plain.test",
            allow=[f"api.test:{api.port}", f"plain.test:{plain.port}"],
            inject={f"api.test:{api.port}": {"Authorization": SECRET}},
            tls="terminate",
            ca_file=str(test_ca.file),
        )
        async with running(net, on_connection=records.append) as (proxy, sock):
            assert proxy.ca_pem is not None and b"BEGIN CERTIFICATE" in proxy.ca_pem
            status, body = await _https_get(
                sock, "api.test", api.port, proxy.ca_pem, "Authorization: Bearer forged\r\n"
            )
            # a host without inject stays passthrough: the kernel sees the upstream's own cert
            other, _ = await _https_get(sock, "plain.test", plain.port, test_ca.ca.pem)
            with pytest.raises(ssl.SSLCertVerificationError):
                await _https_get(sock, "plain.test", plain.port, proxy.ca_pem)
    assert status == 200 and body["target"] == "/echo" and other == 200
    assert api.header(0, "authorization") == [SECRET]
    assert records[0].injected and records[0].method == "GET" and records[0].scheme == "https"
    assert not records[1].injected and records[1].method is None
    assert all(SECRET not in repr(r) for r in records)


async def test_terminate_mode_refuses_a_request_framed_two_ways(test_ca: UpstreamCA) -> None:
    records: list[Connection] = []
    async with upstream(test_ca.server("api.test")) as api:
        net = loopback(
            "api.test",
            allow=[f"api.test:{api.port}"],
            inject={f"api.test:{api.port}": {"Authorization": SECRET}},
            tls="terminate",
            ca_file=str(test_ca.file),
        )
        async with running(net, on_connection=records.append) as (proxy, sock):
            assert proxy.ca_pem is not None
            head, reader, writer = await tunnel(sock, "api.test", api.port)
            assert head.status == 200, head.body
            await writer.start_tls(_client(proxy.ca_pem), server_hostname="api.test")
            writer.write(
                f"POST /echo HTTP/1.1\r\nHost: api.test:{api.port}\r\nContent-Length: 100\r\n"
                "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".encode()
            )
            answer = await read_answer(reader, method=b"POST")
            writer.close()
    assert answer.status == 400 and b"Transfer-Encoding and Content-Length" in answer.body
    assert api.seen == []
    assert [r.reason for r in records] == ["bad request"]


async def test_terminate_mode_refuses_an_upstream_it_cannot_verify(test_ca: UpstreamCA) -> None:
    async with upstream(test_ca.server("api.test")) as up:
        net = loopback(
            "api.test",
            allow=[f"api.test:{up.port}"],
            inject={f"api.test:{up.port}": {"Authorization": SECRET}},
            tls="terminate",
        )
        async with running(net) as (_, sock):
            answer, _, _ = await tunnel(sock, "api.test", up.port)
    assert answer.status == 502 and b"could not be verified" in answer.body


async def test_the_proxy_ca_is_name_constrained_to_the_injected_hosts() -> None:
    from cryptography import x509

    net = Network(allow=["*.corp.test"], inject={"*.api.corp.test": {"X": "1"}}, tls="terminate")
    async with running(net) as (proxy, _):
        assert proxy.ca_pem is not None
        cert = x509.load_pem_x509_certificate(proxy.ca_pem)
        constraints = cert.extensions.get_extension_for_class(x509.NameConstraints)
        assert constraints.critical
        assert [n.value for n in constraints.value.permitted_subtrees or []] == ["api.corp.test"]
        assert len(constraints.value.excluded_subtrees or []) == 2  # every IPv4 and IPv6
        assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 8


async def test_a_leaf_for_a_name_outside_the_constraints_does_not_verify() -> None:
    ca = UpstreamCA("api.test")
    try:
        async with upstream(ca.server("evil.test")) as evil, upstream(ca.server("api.test")) as ok:
            trust = _client(ca.ca.pem)
            _, writer = await asyncio.open_connection(
                "127.0.0.1", ok.port, ssl=trust, server_hostname="api.test"
            )
            writer.close()
            with pytest.raises(ssl.SSLCertVerificationError, match="subtree"):
                await asyncio.open_connection(
                    "127.0.0.1", evil.port, ssl=trust, server_hostname="evil.test"
                )
    finally:
        ca.close()


async def test_an_ipv6_literal_listed_exactly_with_its_address_allowed_is_relayed() -> None:
    server = await asyncio.start_server(_hello, "::1", 0)
    port = server.sockets[0].getsockname()[1]
    net = Network(allow=[f"[::1]:{port}"], allow_addresses=["::1/128"])
    async with server, running(net) as (_, sock):
        answer, reader, writer = await tunnel(sock, "[::1]", port)
        assert answer.status == 200
        assert await reader.read() == b"hello over v6"
        writer.close()
        other, _, _ = await tunnel(sock, "[::1]", port + 1 if port < 65535 else port - 1)
        assert other.status == 403


async def _hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"hello over v6")
    await writer.drain()
    writer.close()


def test_ca_bundle_appends_the_proxy_ca_to_the_system_bundle() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    bundle = ca_bundle(pem)
    assert bundle.endswith(pem)
    assert bundle.count(b"BEGIN CERTIFICATE") > 10  # the system's CAs are there too


async def test_terminate_mode_serves_an_ip_literal_host() -> None:
    ca = UpstreamCA("127.0.0.1")
    try:
        async with upstream(ca.server("127.0.0.1")) as up:
            net = Network(
                allow=[f"127.0.0.1:{up.port}"],
                allow_addresses=["127.0.0.1/32"],
                inject={f"127.0.0.1:{up.port}": {"Authorization": SECRET}},
                tls="terminate",
                ca_file=str(ca.file),
            )
            async with running(net) as (proxy, sock):
                assert proxy.ca_pem is not None
                status, _ = await _https_get(sock, "127.0.0.1", up.port, proxy.ca_pem)
        assert status == 200 and up.header(0, "authorization") == [SECRET]
    finally:
        ca.close()
