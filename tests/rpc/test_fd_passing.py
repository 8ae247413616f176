"""Descriptors passed with a request (a fork's sockets): ``Channel.request(..., fds=)`` on the
host, ``BlockingChannel.take_fds`` on the kernel, over a real socket pair."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from sunroom.errors import ProtocolError
from sunroom.rpc import schema
from sunroom.rpc.blocking import BlockingChannel
from sunroom.rpc.channel import Channel
from sunroom.rpc.messages import Request
from tests.rpc.test_channel import serve_forever


async def test_the_descriptors_are_there_when_the_request_is_read() -> None:
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    pipes = [os.pipe() for _ in range(3)]

    def serve(req: Request) -> None:
        if req.method == "echo":
            peer.respond(req.id, None, req.params)
            return
        assert isinstance(req.params, dict)
        got = peer.take_fds(req.params["fds"])
        for i, fd in enumerate(got):  # the very pipes: what is written here is read there
            os.write(fd, str(i).encode())
            os.close(fd)
        peer.respond(req.id, None, [len(got)])

    server = serve_forever(peer, serve)
    ch = await Channel.open(host_sock, requests=None)
    try:
        for _ in range(20):  # and again: each request takes its own, in order
            fds = [w for _, w in pipes]
            call = ch.request("fork", {"fds": 3}, check=schema.pids, fds=fds)
            assert await asyncio.wait_for(call, 10) == [3]
            assert [os.read(r, 10) for r, _ in pipes] == [b"0", b"1", b"2"]
        assert await asyncio.wait_for(ch.call("echo", 1), 10) == 1  # the channel goes on
    finally:
        await ch.aclose()
        peer.close()
        server.join()
        for r, w in pipes:
            os.close(r)
            os.close(w)


async def test_a_request_that_names_more_than_came_is_refused_and_closes_what_came() -> None:
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    r, w = os.pipe()
    taken: list[int] = []

    def serve(req: Request) -> None:
        try:
            peer.take_fds(2)
        except ValueError as exc:
            peer.respond(req.id, None, [len(str(exc))])
            return
        taken.append(1)

    server = serve_forever(peer, serve)
    ch = await Channel.open(host_sock, requests=None)
    try:
        before = set(os.listdir("/proc/self/fd"))
        call = ch.request("fork", {}, check=schema.pids, fds=[w])
        assert (await asyncio.wait_for(call, 10))[0] > 0
        assert taken == []
        after = set(os.listdir("/proc/self/fd"))
        assert after <= before  # the kernel's copy of the pipe was closed, not kept
        os.close(w)
        assert os.read(r, 1) == b""  # no writer is left anywhere
    finally:
        await ch.aclose()
        peer.close()
        server.join()
        os.close(r)


async def test_descriptors_cannot_jump_frames_waiting_to_be_written() -> None:
    host_sock, peer_sock = socket.socketpair()
    host_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ch = await Channel.open(host_sock, requests=None)
    r, w = os.pipe()
    try:
        for _ in range(200):  # the peer never reads: the transport buffers the rest
            ch.notify("big", b"x" * 65536)
        with pytest.raises(ProtocolError, match="wait to be written"):
            ch.request("fork", {"fds": 1}, check=schema.pids, fds=[w])
    finally:
        await ch.aclose()
        peer_sock.close()
        os.close(r)
        os.close(w)


def test_too_many_descriptors_at_once_close_the_channel() -> None:
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    fds = [os.dup(0) for _ in range(250)]  # more than a fork of 64 copies passes
    try:
        before = set(os.listdir("/proc/self/fd"))
        socket.send_fds(host_sock, [b"\0\0\0\1\xc0"], fds)
        with pytest.raises(ConnectionError):
            peer.next_request()
        assert set(os.listdir("/proc/self/fd")) <= before  # none of what came is kept
    finally:
        for fd in fds:
            os.close(fd)
        host_sock.close()
        peer.close()
