"""Large binaries (file chunks) between the host channel and the kernel's, without copies.

The host sends a chunk as a frame head plus the caller's own buffers (``Framer.frame_parts``);
the kernel receives a large frame straight into a buffer of its own, kept for the next frame of
the same size, and answers a large binary with ``sendmsg`` from where it lies; the host keeps
the mapping of a large frame for the next one of the same size, for ``SPARE_IDLE_S``; its
socket's send buffer is ``SEND_BUFFER``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest

from sunroom.rpc import blocking, channel, codec
from sunroom.rpc.blocking import BlockingChannel
from sunroom.rpc.channel import Channel
from sunroom.rpc.codec import Framer, WireError, decode
from sunroom.rpc.messages import Request
from sunroom.sandbox import files


def test_the_limits() -> None:
    assert files.CHUNK_BYTES == 1024 * 1024 and files.WINDOW == 4
    assert codec.DEFAULT_MAX_FRAME == 16 * 1024 * 1024
    assert blocking.BIG_FRAME == channel.BIG_FRAME == 64 * 1024
    assert blocking.SPARE_FRAME == channel.SPARE_FRAME == 4 * 1024 * 1024
    assert files.CHUNK_BYTES + 64 <= blocking.SPARE_FRAME  # a chunk's frame is kept
    assert channel.SPARE_IDLE_S == 1.0
    assert channel.SEND_BUFFER == 512 * 1024


async def test_the_host_socket_has_room_for_half_a_chunk() -> None:
    host_sock, peer_sock = socket.socketpair()
    ch = await Channel.open(host_sock)
    try:
        got = host_sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert got >= channel.SEND_BUFFER  # Linux reports twice what was set
    finally:
        await ch.aclose()
        peer_sock.close()


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_535, 65_536, 1024 * 1024 + 3])
def test_frame_parts_is_the_frame_of_the_whole_message(size: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    pieces = [memoryview(data)[: size // 3], memoryview(data)[size // 3 : size]]
    framer = Framer()
    parts = framer.frame_parts([0, 7, "file_write_chunk", {"handle": 3, "data": b""}], pieces)
    assert parts[1:] == pieces and parts[1] is pieces[0]  # the tail itself, not a copy
    assert len(parts[0]) < 64
    raw = b"".join(bytes(p) for p in parts)
    assert int.from_bytes(raw[:4], "big") == len(raw) - 4
    whole = [0, 7, "file_write_chunk", {"handle": 3, "data": data[:size]}]
    assert decode(raw[4:]) == whole == decode(framer.frame(whole)[4:])


def test_frame_parts_refuses_what_the_peer_would() -> None:
    framer = Framer(max_frame=1000)
    with pytest.raises(WireError, match="empty binary"):
        framer.frame_parts([1, 2, None, b"x"], [b"y"])
    with pytest.raises(WireError, match="empty binary"):
        framer.frame_parts([1, 2, b"", None], [b"y"])
    framer.frame_parts([1, 2, None, b""], [b"y" * 980])
    with pytest.raises(WireError, match="exceeds the 1000-byte cap"):
        framer.frame_parts([1, 2, None, b""], [b"y" * 500, b"z" * 500])


async def test_chunks_cross_both_ways_whole() -> None:
    """Chunks of every size about the thresholds, a few in flight, echoed by the kernel end."""
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    sizes = [1, 65_535, 65_536, 65_537, 1024 * 1024, 1024 * 1024, 1024 * 1024, 300_001]
    sizes += [1024 * 1024] * 6
    received: list[int] = []

    def serve() -> None:
        while True:
            try:
                req: Request = peer.next_request()
            except ConnectionError:
                return
            assert isinstance(req.params, dict)
            data = req.params["data"]
            received.append(len(data))
            # answered from a mutable buffer through a view, as the file server does
            peer.respond(req.id, None, memoryview(bytearray(data)))

    thread = threading.Thread(target=serve)
    thread.start()
    ch = await Channel.open(host_sock, requests=None)
    try:
        futures = []
        expected = []
        for i, size in enumerate(sizes):
            data = bytes((i + j) % 251 for j in range(min(size, 4096))) * (size // 4096 + 1)
            data = data[:size]
            expected.append(data)
            cut = size // 2
            tail = [memoryview(data)[:cut], memoryview(data)[cut:]]
            params = {"handle": 1, "data": b""}
            futures.append(ch.request("echo", params, tail=tail))
            if len(futures) >= 4:
                await asyncio.sleep(0)
        answers: list[Any] = await asyncio.gather(*futures)
        assert [len(a) for a in answers] == sizes == received
        assert answers == expected
        assert ch._spare is not None  # the last 1 MiB frame's mapping, kept
        assert peer._spare is not None and len(peer._spare) > 1024 * 1024
        await asyncio.sleep(channel.SPARE_IDLE_S + 0.3)
        assert ch._spare is None  # let go once unused
    finally:
        await ch.aclose()
        await asyncio.to_thread(thread.join, 10)
        peer.close()
