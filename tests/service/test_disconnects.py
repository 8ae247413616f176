"""A client that goes away mid-request is not a server error (issue 26, item 4).

A real server on loopback (in this process, so its log is captured), raw sockets that send a
request head and part of its body, then close (or stall until the read deadline cuts them).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

import pytest

from tests.service.conftest import TOKEN, Server


def _cut(server: Server, path: str, *, close: bool) -> None:
    """POST *path* declaring a 1000-byte body, send 10 bytes; close, or wait to be cut off."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        sock.sendall(head.encode() + b'{"code": "')
        if not close:
            while sock.recv(4096):  # the 408, then the server's close
                pass
    finally:
        sock.close()


def _noise(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info is not None]


def test_a_client_that_disconnects_mid_body_is_no_server_error(
    make_server: Callable[..., Server], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = make_server(read_timeout_s=0.5)
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    paths = ["/kernels", f"/kernels/{kid}/execute", f"/kernels/{kid}/fork", "/sessions"]
    for path in paths:
        for _ in range(5):
            _cut(server, path, close=True)
    for path in paths:  # slowloris: cut by the read deadline
        _cut(server, path, close=False)
    time.sleep(0.5)  # the server has seen every close
    noise = _noise(caplog)
    assert not noise, "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in noise)
    quiet = [r for r in caplog.records if r.name.startswith("sunroom") and "disconnect" in r.msg]
    assert len(quiet) <= 4 * 6  # at most one line per request, none above INFO
    r = server.client.post(f"/kernels/{kid}/execute", json={"code": "1 + 1"})
    assert r.status_code == 200 and r.json()["value"] == "2"  # the kernel was not disturbed
    assert server.client.get("/healthz").json()["kernels"] == 1
