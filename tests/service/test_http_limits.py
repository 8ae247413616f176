"""The HTTP edge: Host allowlist, read deadlines, connection caps, a clean SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sunroom.service import ServiceConfig
from sunroom.service.config import MAX_HEADER_BYTES
from tests.service.conftest import TOKEN, Server

ROOT = Path(__file__).resolve().parents[2]


def test_a_foreign_host_header_is_refused(make_server: Callable[..., Server]) -> None:
    server = make_server()
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example"):
        r = server.client.get("/sessions", headers={"host": host})
        assert r.status_code == 400, (host, r.text)
        assert r.json()["error"]["type"] == "HostNotAllowed"
        assert server.anon.get("/healthz", headers={"host": host}).status_code == 400
    for host in ("127.0.0.1", f"127.0.0.1:{server.port}", "localhost:1", "[::1]:8765"):
        assert server.client.get("/sessions", headers={"host": host}).status_code == 200, host


def test_allowed_hosts_are_configurable(
    make_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(allowed_hosts=("sunroom.internal",))
    assert server.client.get("/sessions", headers={"host": "sunroom.internal:80"}).is_success
    assert server.client.get("/sessions", headers={"host": "evil.example"}).status_code == 400
    monkeypatch.setenv("SUNROOM_ALLOWED_HOSTS", "a.example, b.example")
    config = ServiceConfig.from_env()
    assert config.allowed_hosts == ("a.example", "b.example")
    assert config.host_allowed("b.example:9") and not config.host_allowed("c.example")


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closed *sock* within *seconds*; what it sent."""
    sock.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, data
        if not chunk:
            return True, data
        data += chunk
    return False, data


def test_a_slow_request_head_or_body_is_cut_off(make_server: Callable[..., Server]) -> None:
    server = make_server(read_timeout_s=1.0)
    slow_head = socket.create_connection(("127.0.0.1", server.port))
    slow_body = socket.create_connection(("127.0.0.1", server.port))
    try:
        slow_head.sendall(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: 1\r\n")
        slow_body.sendall(
            f"POST /kernels HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Length: 100\r\n\r\n{".encode()
        )
        start = time.monotonic()
        for sock in (slow_head, slow_body):
            sock.sendall(b"X")  # trickling in does not extend the deadline
        closed, data = _closed_within(slow_head, 3.0)
        assert closed and time.monotonic() - start < 3.0
        assert b" 408 " in data.split(b"\r\n", 1)[0] and b"RequestTimeout" in data
        closed, _ = _closed_within(slow_body, 3.0)
        assert closed
    finally:
        slow_head.close()
        slow_body.close()
    assert server.client.get("/healthz").status_code == 200


def test_a_head_trickled_in_past_the_cap_is_a_431(make_server: Callable[..., Server]) -> None:
    """The head cap holds for a header that never ends, arriving a little at a time."""
    server = make_server()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.sendall(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        sent = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < 256 * 1024:
                sock.sendall(b"a" * 1024)
                sent += 1024
                time.sleep(0.002)  # separate reads on the server
        closed, data = _closed_within(sock, 3.0)
        assert closed
        assert b" 431 " in data.split(b"\r\n", 1)[0] and b"HeadersTooLarge" in data, data
        assert sent < 64 * 1024  # refused near the cap, not at the end of the stream
    finally:
        sock.close()


def test_a_head_under_the_cap_and_pipelined_requests_are_served(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    big = f"X-Big: {'a' * (MAX_HEADER_BYTES - 1024)}\r\n"
    one = f"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall((one + big + "\r\n" + one + "Connection: close\r\n\r\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200 ") == 2, data
    # the same head arriving in pieces (several reads) is measured once, not per read
    head = (one + big + "Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        for at in range(0, len(head), 2048):
            sock.sendall(head[at : at + 2048])
            time.sleep(0.01)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 "), data


def test_an_idle_kept_alive_connection_outlives_the_read_deadline(
    make_server: Callable[..., Server],
) -> None:
    """The read deadline times a request being received, not a connection between requests."""
    server = make_server(read_timeout_s=0.5)
    one = f"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        for _ in range(2):
            sock.sendall(one.encode())
            data = b""
            while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                data += sock.recv(65536)
            assert data.startswith(b"HTTP/1.1 200 "), data
            time.sleep(1.0)  # idle past the read deadline (within uvicorn's keep-alive)


def test_connections_are_capped_per_client_and_in_total(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(max_connections_per_client=20, max_connections=40)
    socks = []
    try:
        for _ in range(30):
            socks.append(socket.create_connection(("127.0.0.1", server.port)))
        time.sleep(0.3)
        refused = 0
        for sock in socks:
            closed, data = _closed_within(sock, 0.05)
            if closed:
                refused += 1
                assert b" 503 " in data and b"TooManyConnections" in data
        assert refused == 10
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.3)
    assert server.client.get("/healthz").status_code == 200  # the slots were given back


@pytest.fixture
def service(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    replies = tmp_path / "replies.json"
    code = "import time\ntime.sleep(60)"
    replies.write_text(json.dumps({"replies": [{"text": "wait", "code": code}, "done"]}))
    env = {**os.environ, "SUNROOM_TOKEN": TOKEN, "SUNROOM_MODEL": f"scripted:{replies}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0",
         "--db", str(tmp_path / "s.db"), "--backend", "subprocess"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_sigterm_with_a_live_sse_client_exits_0_at_once(
    service: subprocess.Popen[str],
) -> None:
    assert service.stdout is not None and service.stderr is not None
    line = service.stdout.readline()
    assert "listening on" in line, line
    url = line.rsplit(" ", 1)[-1].strip()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.get("/healthz").json()["ok"]:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        sid = client.post("/sessions", json={"task": "wait"}).json()["session_id"]
        with client.stream("GET", f"/sessions/{sid}/events") as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            while "CodeSubmitted" not in next(lines):  # the run is in its long cell
                pass
            start = time.monotonic()
            service.send_signal(signal.SIGTERM)
            rest = list(lines)  # the stream ends cleanly (no transport error)
            assert time.monotonic() - start < 2.0, rest
        code = service.wait(5)
        took = time.monotonic() - start
    stderr = service.stderr.read()
    assert code == 0, (code, stderr)
    assert took < 2.0, took
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr


def test_the_connection_caps_come_from_the_environment_and_are_documented(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 26, item 7: the caps could only be set in code; behind a proxy they need setting."""
    monkeypatch.setenv("SUNROOM_MAX_CONNECTIONS", "2048")
    monkeypatch.setenv("SUNROOM_MAX_CONNECTIONS_PER_CLIENT", "2048")
    config = ServiceConfig.from_env()
    assert (config.max_connections, config.max_connections_per_client) == (2048, 2048)
    doc = (ROOT / "docs" / "service.md").read_text()
    for words in ("SUNROOM_MAX_CONNECTIONS_PER_CLIENT", "X-Forwarded-For", "reverse proxy"):
        assert words in doc, words
