"""The hand-off socket (sunroom.network.handoff) and the kernel's side of it (sunroom.prelude.egress).

A kernel's supervisor binds 127.0.0.1:PORT and sends the listener to the proxy; the proxy then
accepts the kernel's connections itself. Here the real proxy runs in this process and real
descriptors of every kind are sent to its hand-off socket, as hostile kernel code could.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from sunroom.network import EgressProxy
from sunroom.network.handoff import MAX_LISTENERS, MAX_SENDERS
from sunroom.prelude import egress
from sunroom.prelude.supervisor import NO_WAY_OUT

from .upstream import get, loopback, read_answer, running, upstream


def handoff_proxy(port: int = 80) -> AbstractAsyncContextManager[tuple[EgressProxy, Path]]:
    """A proxy listening for hand-offs, with no listener handed to it yet."""
    network = loopback("api.test", allow=[f"api.test:{port}"])
    return running(network, way_in="handoff", hand_listener=False)


def _send(sock: Path, fds: list[int], data: bytes = b"\x01") -> socket.socket:
    """Connect to the hand-off socket and send *fds*; the open connection is returned."""
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sender.connect(str(sock))
    if fds:
        socket.send_fds(sender, [data], fds)
    else:
        sender.sendall(data)
    return sender


async def _status(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    answer = await read_answer(reader)
    writer.close()
    return answer.status


async def _until(condition: object, what: str) -> None:
    for _ in range(500):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_a_handed_over_listener_is_served_by_the_proxy_and_closed_with_it() -> None:
    async with upstream() as origin, handoff_proxy(origin.port) as (proxy, sock):
        listener = egress.listen(0)
        port = listener.getsockname()[1]
        await asyncio.to_thread(egress.hand_over, listener, str(sock))
        listener.close()  # as the supervisor does: the proxy holds the only copy
        allowed = get("api.test", origin.port, "/echo")
        assert await _status(port, allowed) == 200
        assert await _status(port, get("other.test", origin.port, "/echo")) == 403
        assert proxy.connections == 2
    with pytest.raises(ConnectionRefusedError):  # the port went with the proxy
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


async def test_every_descriptor_that_is_not_a_tcp_listener_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_bytes(b"x")
    pipe_r, pipe_w = os.pipe()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unix_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_listener.bind(str(tmp_path / "u.sock"))
    unix_listener.listen()
    unbound = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server = socket.create_server(("127.0.0.1", 0))
    connected = socket.create_connection(server.getsockname())
    handles = [udp, unix_listener, unbound, server, connected]
    fd = os.open(file, os.O_RDONLY)
    try:
        async with handoff_proxy() as (proxy, sock):
            wrong = [fd, pipe_r, udp.fileno(), unix_listener.fileno(), unbound.fileno()]
            wrong.append(connected.fileno())
            senders = [_send(sock, [one]) for one in wrong]
            handoff = proxy._handoff
            assert handoff is not None
            await _until(lambda: handoff.refused == len(wrong), "all refused")
            assert handoff.adopted == 0
            # the host closed its copies: the kernel's own descriptors are untouched
            assert os.read(fd, 1) == b"x"
            connected.sendall(b"still mine")
            for sender in senders:
                sender.close()
    finally:
        for handle in handles:
            handle.close()
        for one in (fd, pipe_r, pipe_w):
            os.close(one)


async def test_listeners_past_the_cap_are_refused() -> None:
    async with handoff_proxy() as (proxy, sock):
        listeners = [egress.listen(0) for _ in range(MAX_LISTENERS + 1)]
        ports = [listener.getsockname()[1] for listener in listeners]
        for listener in listeners:
            await asyncio.to_thread(egress.hand_over, listener, str(sock))
            listener.close()
        handoff = proxy._handoff
        assert handoff is not None
        await _until(lambda: handoff.refused == 1, "one refused")
        assert handoff.adopted == MAX_LISTENERS
        for port in ports[:-1]:  # served: the proxy answers (400: not a proxy request)
            assert await _status(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == 400
        with pytest.raises(ConnectionRefusedError):  # the host kept no copy of the refused one
            socket.create_connection(("127.0.0.1", ports[-1]), timeout=5).close()
    assert MAX_LISTENERS == 4


async def test_a_sender_without_descriptors_is_dropped_and_senders_are_capped() -> None:
    async with handoff_proxy() as (_, sock):
        chatty = _send(sock, [], b"GET / HTTP/1.1\r\n\r\n")
        chatty.settimeout(5)
        assert await asyncio.to_thread(chatty.recv, 1) == b""  # closed: bytes are not a hand-off
        chatty.close()
        held = [_send(sock, [], b"") for _ in range(MAX_SENDERS)]
        await asyncio.sleep(0.2)
        extra = _send(sock, [], b"")
        extra.settimeout(5)
        assert await asyncio.to_thread(extra.recv, 1) == b""  # over the cap: closed at once
        extra.close()
        for sender in held:
            sender.close()
    assert MAX_SENDERS == 16


def test_hand_over_to_no_proxy_raises(tmp_path: Path) -> None:
    with egress.listen(0) as listener, pytest.raises(FileNotFoundError):
        egress.hand_over(listener, str(tmp_path / "absent.sock"))


def test_a_supervisor_that_cannot_reach_the_proxy_exits_before_any_kernel(tmp_path: Path) -> None:
    config = {"port": 0, "socket": str(tmp_path / "absent.sock")}
    code = (
        f"from sunroom.prelude.supervisor import _open_way_out; _open_way_out({json.dumps(config)})"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == NO_WAY_OUT == 71
    assert done.stderr.strip().startswith(
        "sunroom: the kernel's network listener could not be given to the egress proxy"
    )
