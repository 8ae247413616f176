"""The kernel's TCP → Unix-socket forwarder (sunroom.prelude.forwarder), on the host.

A real Unix-socket server stands in for the egress proxy; real TCP clients connect to the
forwarder on 127.0.0.1 (an ephemeral port, as in a sandbox's own network namespace).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunroom.prelude import forwarder


class UnixServer:
    """Echo, or (for b"SINK n") swallow n bytes and answer their sha256; counts connections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(512)
        self.accepted = 0
        self.open = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = conn.recv(64)
            if head.startswith(b"SINK "):
                size = int(head.split()[1])
                digest = hashlib.sha256()
                while size:
                    chunk = conn.recv(min(size, 1 << 20))
                    if not chunk:
                        break
                    digest.update(chunk)
                    size -= len(chunk)
                conn.sendall(digest.hexdigest().encode())
            elif head.startswith(b"SEND "):
                conn.sendall(os.urandom(16) * (int(head.split()[1]) // 16))
            else:
                while head:
                    conn.sendall(head)
                    head = conn.recv(65536)
        with self.lock:
            self.open -= 1


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[int, UnixServer]]:
    server = UnixServer(tmp_path / "proxy.sock")
    listener = forwarder.listen(0)
    port = listener.getsockname()[1]
    forwarder.Forwarder(listener, str(server.path)).start()
    yield port, server
    server.sock.close()


def _client(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_bytes_pass_both_ways_unchanged(relay: tuple[int, UnixServer]) -> None:
    port, _ = relay
    with _client(port) as c:
        sent = b"CONNECT example.org:443 HTTP/1.1\r\n\r\n"
        c.sendall(sent)
        got = b""
        while len(got) < len(sent):
            got += c.recv(100)
        assert got == sent


def test_a_large_upload_and_download_keep_every_byte(relay: tuple[int, UnixServer]) -> None:
    port, _ = relay
    payload = os.urandom(32 * 1024 * 1024)
    with _client(port) as c:
        c.sendall((b"SINK %d" % len(payload)).ljust(64))
        c.sendall(payload)
        answer = c.recv(64)
    assert answer.decode() == hashlib.sha256(payload).hexdigest()
    size = 48 * 1024 * 1024
    with _client(port) as c:
        c.sendall((b"SEND %d" % size).ljust(64))
        received = 0
        while chunk := c.recv(1 << 20):
            received += len(chunk)
    assert received == size  # the proxy's close reaches the client after the last byte


def test_a_half_closed_client_still_gets_its_answer(relay: tuple[int, UnixServer]) -> None:
    port, _ = relay
    with _client(port) as c:
        c.sendall(b"SINK 5".ljust(64) + b"hello")
        c.shutdown(socket.SHUT_WR)  # the request is complete; the answer still comes back
        assert c.recv(64).decode() == hashlib.sha256(b"hello").hexdigest()


def test_connections_past_the_cap_are_closed_and_the_rest_work(
    relay: tuple[int, UnixServer],
) -> None:
    port, server = relay
    held = [_client(port) for _ in range(forwarder.MAX_CONNECTIONS)]
    try:
        for c in held:  # each is relayed: an echo proves the pair exists
            c.sendall(b"x")
            assert c.recv(1) == b"x"
        extra = _client(port)
        extra.settimeout(5)
        assert extra.recv(1) == b""  # closed at once, never relayed
        extra.close()
        assert server.accepted == forwarder.MAX_CONNECTIONS
    finally:
        for c in held:
            c.close()
    deadline = time.monotonic() + 10
    while True:  # closed pairs free their slots (once the forwarder has seen them end)
        with _client(port) as c:
            c.sendall(b"y")
            try:
                if c.recv(1) == b"y":
                    break
            except ConnectionResetError:
                pass
        assert time.monotonic() < deadline, "no slot came free"
        time.sleep(0.05)


def test_no_proxy_socket_closes_the_client(tmp_path: Path) -> None:
    listener = forwarder.listen(0)
    port = listener.getsockname()[1]
    forwarder.Forwarder(listener, str(tmp_path / "absent.sock")).start()
    with _client(port) as c:
        assert c.recv(1) == b""
