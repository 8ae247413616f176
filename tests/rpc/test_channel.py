"""The host channel against a live peer: calls both ways, and 10,000 hostile inputs."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from typing import Any

import msgpack
import pytest

from sunroom.errors import ClosedError, ProtocolError
from sunroom.rpc import encode, frame, schema
from sunroom.rpc.blocking import BlockingChannel, CallFailed
from sunroom.rpc.channel import (
    MAX_ERROR_TEXT,
    MAX_INCOMING_REQUESTS,
    Channel,
    RemoteError,
    RpcFailure,
)
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
    ch = await Channel.open(host_sock, handler=echo_handler, requests=None)
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


# -- what a kernel peer may send, and what it costs the host ---------------------------------------


def read_frames(sock: socket.socket, count: int) -> list[Any]:
    """Read *count* whole messages from a raw socket (blocking)."""
    buf, out = bytearray(), list[Any]()
    while len(out) < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4:
            (size,) = struct.unpack_from(">I", buf)
            if len(buf) < 4 + size:
                break
            out.append(msgpack.unpackb(bytes(buf[4 : 4 + size])))
            del buf[: 4 + size]
    return out


async def closed_by_violation(ch: Channel, within_s: float = 2.0) -> str:
    await asyncio.wait_for(asyncio.shield(ch.closed), within_s)
    assert isinstance(ch.close_reason, ProtocolError), ch.close_reason
    return str(ch.close_reason)


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ([2, "stream", {"name": "stdin", "text": "x"}], "stream.name"),
        ([2, "stream", {"name": "stdout", "text": b"x"}], "stream.text must be a str"),
        ([2, "hello", {"protocol": "one"}], "hello.protocol must be an int"),
        ([0, 1, "call", {"name": 5, "args": {}}], "call.name must be a str"),
        ([0, 1, "call", {"name": "f" * 129, "args": {}}], "at most 128 characters"),
        ([0, 1, "call", {"name": "f", "args": [1]}], "call.args must be a map"),
    ],
)
async def test_kernel_messages_are_checked_before_use(message: list[Any], why: str) -> None:
    host_sock, peer_sock = socket.socketpair()
    seen: list[Any] = []
    ch = await Channel.open(
        host_sock, handler=echo_handler, on_notification=lambda m, p: seen.append(p)
    )
    peer_sock.sendall(frame(message))
    assert why in await closed_by_violation(ch)
    assert seen == []
    peer_sock.close()
    await ch.aclose()


async def test_checked_messages_reach_the_host_rebuilt() -> None:
    host_sock, peer_sock = socket.socketpair()
    seen: list[Any] = []
    ch = await Channel.open(
        host_sock, handler=echo_handler, on_notification=lambda m, p: seen.append((m, p))
    )
    peer_sock.sendall(frame([2, "stream", {"name": "stdout", "text": "hi", "extra": [1]}]))
    peer_sock.sendall(frame([0, 7, "call", {"name": "f", "args": {"a": 1}, "extra": 2}]))
    answers = await asyncio.to_thread(read_frames, peer_sock, 1)
    assert seen == [("stream", {"name": "stdout", "text": "hi"})]
    assert answers == [[1, 7, None, ["call", {"name": "f", "args": {"a": 1}}]]]
    assert not ch.closed.done()
    peer_sock.close()
    await ch.aclose()


async def test_duplicates_and_unknowns_are_refused_counted_and_survived() -> None:
    """A duplicate id of a request in flight is dropped, an unknown method answered
    MethodNotFound without reaching the handler, an unknown notification dropped: each
    counted in ``refused``; the channel keeps working."""
    host_sock, peer_sock = socket.socketpair()
    served: list[Any] = []
    release = asyncio.Event()

    async def handler(method: str, params: Any) -> Any:
        served.append((method, params))
        await release.wait()
        return "done"

    seen: list[Any] = []
    ch = await Channel.open(host_sock, handler=handler, on_notification=lambda m, p: seen.append(m))
    peer_sock.sendall(frame([0, 1, "call", {"name": "f", "args": {}}]))
    peer_sock.sendall(frame([0, 1, "call", {"name": "f", "args": {"again": 1}}]))  # duplicate
    peer_sock.sendall(frame([0, 2, "other", [1]]))  # unknown method
    peer_sock.sendall(frame([2, "display", {"png": b""}]))  # unknown notification
    answers = await asyncio.to_thread(read_frames, peer_sock, 1)
    assert answers == [[1, 2, {"type": "MethodNotFound", "message": "no handler for 'other'",
                               "data": None}, None]]  # fmt: skip
    release.set()
    answers = await asyncio.to_thread(read_frames, peer_sock, 1)
    assert answers == [[1, 1, None, "done"]]
    assert served == [("call", {"name": "f", "args": {}})]  # served once, never "other"
    assert seen == [] and ch.refused == 3
    assert not ch.closed.done()
    peer_sock.close()
    await ch.aclose()


async def test_a_malformed_answer_fails_the_call_and_closes_the_channel() -> None:
    host_sock, peer_sock = socket.socketpair()
    ch = await Channel.open(host_sock)
    check = schema.execute_result(1000)
    call = ch.request("execute", {"code": "1"}, check=check)
    other = ch.request("variables", None, check=schema.variables)
    (req, _) = await asyncio.to_thread(read_frames, peer_sock, 2)
    peer_sock.sendall(frame([1, req[1], None, 42]))
    with pytest.raises(ProtocolError, match="the answer to 'execute' is malformed"):
        await call
    with pytest.raises(ProtocolError):
        await other  # the channel cannot be trusted any more: every pending call fails
    assert "malformed" in await closed_by_violation(ch)
    peer_sock.close()
    await ch.aclose()


async def test_error_messages_to_the_peer_are_cut() -> None:
    host_sock, peer_sock = socket.socketpair()

    async def loud(method: str, params: Any) -> Any:
        raise ValueError("x" * 100_000)

    ch = await Channel.open(host_sock, handler=loud, requests=None)
    peer_sock.sendall(frame([0, 1, "m", None]))
    [answer] = await asyncio.to_thread(read_frames, peer_sock, 1)
    assert answer[2]["type"] == "ValueError"
    assert len(answer[2]["message"]) < MAX_ERROR_TEXT + 50
    peer_sock.close()
    await ch.aclose()


async def test_answers_wait_while_the_peer_is_not_reading() -> None:
    """400 calls answered with 1 MiB each: nothing is computed for a peer that does not read."""
    host_sock, peer_sock = socket.socketpair()
    computed = 0

    async def big(method: str, params: Any) -> Any:
        nonlocal computed
        computed += 1
        return "b" * (1 << 20)

    ch = await Channel.open(host_sock, handler=big, requests=None)

    def send() -> None:
        for i in range(400):
            peer_sock.sendall(frame([0, i, "big", None]))

    sender = threading.Thread(target=send)
    sender.start()
    await asyncio.sleep(0.5)  # the peer reads nothing meanwhile
    transport = ch._transport
    assert transport is not None
    assert transport.get_write_buffer_size() <= (1 << 20) + (64 << 10) + 64
    assert computed <= 3  # a handful, not 400 (nor MAX_INCOMING_REQUESTS)
    answers = await asyncio.to_thread(read_frames, peer_sock, 400)  # reading again drains all
    assert sorted(a[1] for a in answers) == list(range(400))
    assert all(a[3] == "b" * (1 << 20) for a in answers)
    await asyncio.to_thread(sender.join)
    peer_sock.close()
    await ch.aclose()


async def test_large_frames_keep_their_order_among_small_ones() -> None:
    host_sock, peer_sock = socket.socketpair()
    seen: list[str] = []

    def on_stream(method: str, params: object) -> None:
        assert isinstance(params, dict)
        seen.append(params["text"][:1])

    ch = await Channel.open(host_sock, on_notification=on_stream)
    texts = ["a", "b" * (300 << 10), "c", "d" * (10 << 10), "e", "f" * (3 << 20), "g"]
    data = b"".join(frame([2, "stream", {"name": "stdout", "text": t}]) for t in texts)
    await asyncio.to_thread(peer_sock.sendall, data)
    for _ in range(200):
        if len(seen) == len(texts):
            break
        await asyncio.sleep(0.01)
    assert seen == list("abcdefg")
    assert not ch.closed.done()
    peer_sock.close()
    await ch.aclose()


@pytest.mark.parametrize(
    ("start", "why"),
    [
        # 16 MiB of empty maps: refused once ~1 MiB has arrived
        (b"\x93\x02\xa6stream\xdd" + struct.pack(">I", 16 << 20) + b"\x80" * (2 << 20), "values"),
        # a call naming a 15 MiB function: refused from its first bytes
        (
            b"\x94\x00\x01\xa4call\x82\xa4name\xdb" + struct.pack(">I", 15 << 20) + b"x" * 4096,
            "at most 128 characters",
        ),
    ],
)
async def test_a_hostile_large_frame_is_refused_before_it_has_all_arrived(
    start: bytes, why: str
) -> None:
    host_sock, peer_sock = socket.socketpair()
    ch = await Channel.open(host_sock, frame_deadline_s=30)
    peer_sock.setblocking(False)
    header = struct.pack(">I", (16 << 20) - 64)
    with contextlib.suppress(BlockingIOError):
        peer_sock.send(header + start)
    assert why in await closed_by_violation(ch)  # long before the 30 s deadline
    peer_sock.close()
    await ch.aclose()


async def test_the_read_deadline_waits_while_the_channel_is_paused() -> None:
    """A frame half-received while the host stopped reading is not a stalled peer."""
    host_sock, peer_sock = socket.socketpair()
    release = asyncio.Event()

    async def slow(method: str, params: Any) -> Any:
        await release.wait()
        return method

    ch = await Channel.open(host_sock, handler=slow, frame_deadline_s=0.2, requests=None)
    requests = b"".join(frame([0, i, "slow", None]) for i in range(MAX_INCOMING_REQUESTS))
    tail = frame([0, 10_000, "slow", "x" * 100])
    await asyncio.to_thread(peer_sock.sendall, requests + tail[:20])
    await asyncio.sleep(0.6)  # paused (too many requests served), half a frame buffered
    assert not ch.closed.done(), ch.close_reason
    release.set()
    await asyncio.to_thread(peer_sock.sendall, tail[20:])
    answers = await asyncio.to_thread(read_frames, peer_sock, MAX_INCOMING_REQUESTS + 1)
    assert len(answers) == MAX_INCOMING_REQUESTS + 1
    peer_sock.close()
    await ch.aclose()


async def test_a_cancel_of_aclose_while_it_waits_for_a_served_call_propagates() -> None:
    """The served call absorbs the cancel asyncio passes on to it: aclose's caller still sees its own."""
    host_sock, peer_sock = socket.socketpair()
    entered, release = asyncio.Event(), asyncio.Event()

    async def stubborn(method: str, params: Any) -> Any:
        entered.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        return None

    ch = await Channel.open(host_sock, handler=stubborn, requests=None)
    peer_sock.sendall(frame([0, 1, "m", None]))
    await entered.wait()
    closing = asyncio.create_task(ch.aclose())
    await asyncio.sleep(0.01)  # aclose has cancelled the served call and waits for it
    closing.cancel()
    await asyncio.sleep(0.01)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await closing
    peer_sock.close()
