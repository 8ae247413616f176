"""The host channel against a live peer: calls both ways, and 10,000 hostile inputs."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from typing import Any

import pytest

from sunroom.errors import ClosedError, ProtocolError
from sunroom.rpc import encode, frame
from sunroom.rpc.blocking import BlockingChannel, CallFailed
from sunroom.rpc.channel import Channel, RemoteError, RpcFailure
from sunroom.rpc.messages import Request, RpcError


def serve_forever(peer: BlockingChannel, serve: Any) -> threading.Thread:
    """Answer the host's requests on a thread, as the kernel's main thread does."""

    def loop() -> None:
        while True:
            try:
                req = peer.next_request()
            except ConnectionError:
                return
            serve(req)

    t = threading.Thread(target=loop)
    t.start()
    return t


async def echo_handler(method: str, params: Any) -> Any:
    if method == "fail":
        raise RpcFailure(RpcError("Nope", "refused", {"why": 1}))
    if method == "boom":
        raise ValueError("bad value")
    if method == "sleep":
        await asyncio.sleep(params)
    return [method, params]


async def test_calls_both_ways_with_many_in_flight() -> None:
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)

    def serve(req: Request) -> None:
        peer.respond(req.id, None, {"echo": req.params})

    server = serve_forever(peer, serve)
    ch = await Channel.open(host_sock, handler=echo_handler)
    try:
        results = await asyncio.gather(*(ch.call("echo", i) for i in range(200)))
        assert results == [{"echo": i} for i in range(200)]

        def from_kernel() -> list[Any]:
            out: list[Any] = []
            threads = []

            def one(i: int) -> None:
                out.append(peer.call("m", i))

            for i in range(20):
                t = threading.Thread(target=one, args=(i,))
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            return out

        got = await asyncio.to_thread(from_kernel)
        assert sorted(x[1] for x in got) == list(range(20))
        with pytest.raises(CallFailed) as info:
            await asyncio.to_thread(peer.call, "fail", None)
        assert info.value.error == RpcError("Nope", "refused", {"why": 1})
        with pytest.raises(CallFailed, match="ValueError: bad value"):
            await asyncio.to_thread(peer.call, "boom", None)
    finally:
        await ch.aclose()
        peer.close()
        server.join()
    with pytest.raises(ClosedError):
        await ch.call("after", None)


async def test_remote_error_and_abandoned_call() -> None:
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    release = threading.Event()

    def serve(req: Request) -> None:
        if req.method == "slow":

            def later() -> None:
                release.wait()
                peer.respond(req.id, None, "late")

            threading.Thread(target=later).start()
        else:
            peer.respond(req.id, RpcError("Bad", "no"))

    server = serve_forever(peer, serve)
    ch = await Channel.open(host_sock)
    try:
        with pytest.raises(RemoteError, match="Bad: no"):
            await ch.call("x")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ch.call("slow"), 0.05)
        release.set()
        await asyncio.sleep(0.05)
        # a late answer to an abandoned call is dropped, not a protocol error
        assert not ch.closed.done()
        with pytest.raises(RemoteError):
            await ch.call("x")
    finally:
        await ch.aclose()
        peer.close()
        server.join()


def _random_garbage(rng: random.Random) -> bytes:
    kind = rng.randrange(9)
    if kind == 0:  # random bytes
        return rng.randbytes(rng.randrange(1, 200))
    if kind == 1:  # a length claiming 4 GiB
        return struct.pack(">I", 0xFFFFFFFF) + rng.randbytes(rng.randrange(0, 64))
    if kind == 2:  # oversized but honest length
        return struct.pack(">I", 2048) + b"\x00" * 2048
    if kind == 3:  # deeply nested
        depth = rng.randrange(65, 3000)
        payload = b"\x91" * depth + b"\xc0"
        return struct.pack(">I", len(payload)) + payload
    if kind == 4:  # response to an id never sent (out of order)
        return frame([1, rng.randrange(1, 2**32), None, "x"])
    if kind == 5:  # valid framing, wrong shape
        shape = rng.choice([[7], {"a": 1}, "s", [0, "id", "m", None], [2, 5, None], [1, 1]])
        return frame(shape)
    if kind == 6:  # truncated frame, then the peer hangs up
        full = frame([2, "stream", {"text": "x" * rng.randrange(100)}])
        return full[: rng.randrange(1, len(full))]
    if kind == 7:  # garbage length prefix followed by msgpack that is not what it claims
        payload = encode([2, "x", None])
        return struct.pack(">I", len(payload) + rng.randrange(1, 50)) + payload
    payload = rng.randbytes(rng.randrange(1, 100))
    return struct.pack(">I", len(payload)) + payload


async def test_ten_thousand_hostile_inputs_never_crash_the_host() -> None:
    rng = random.Random(1234)
    outcomes = {"protocol": 0, "closed": 0}
    notified = 0

    def on_note(method: str, params: Any) -> None:
        nonlocal notified
        notified += 1

    for _ in range(10_000):
        host_sock, peer_sock = socket.socketpair()
        ch = await Channel.open(
            host_sock, on_notification=on_note, max_frame=1024, frame_deadline_s=0.5
        )
        peer_sock.sendall(_random_garbage(rng))
        peer_sock.close()
        await asyncio.wait_for(asyncio.shield(ch.closed), 5)
        if isinstance(ch.close_reason, ProtocolError):
            outcomes["protocol"] += 1
        else:
            outcomes["closed"] += 1
        with pytest.raises((ClosedError, ProtocolError)):
            await ch.call("still-there?")
        await ch.aclose()
    assert outcomes["protocol"] + outcomes["closed"] == 10_000
    assert outcomes["protocol"] > 7_000


async def test_stalled_partial_frame_hits_the_read_deadline() -> None:
    host_sock, peer_sock = socket.socketpair()
    ch = await Channel.open(host_sock, frame_deadline_s=0.2)
    pending = asyncio.ensure_future(ch.call("x"))
    peer_sock.sendall(struct.pack(">I", 100) + b"\x92")
    await asyncio.wait_for(asyncio.shield(ch.closed), 2)
    assert isinstance(ch.close_reason, ProtocolError)
    assert "incomplete" in str(ch.close_reason)
    with pytest.raises(ProtocolError):
        await pending
    await ch.aclose()
    peer_sock.close()
