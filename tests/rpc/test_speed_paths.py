"""The fast paths keep the semantics of the slow ones.

Eager serving, the pending-request table without per-request callbacks, the reusable packer
and the Framer. No timing assertions: benchmarks/kernel.py measures the speed.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
from typing import Any

import msgpack
import pytest

from sunroom import AsyncKernel
from sunroom.errors import ProtocolError
from sunroom.rpc import frame
from sunroom.rpc.blocking import BlockingChannel
from sunroom.rpc.channel import MAX_PENDING_SWEEP, Channel
from sunroom.rpc.codec import Framer, WireError
from sunroom.rpc.eager import in_task, start_eagerly
from sunroom.rpc.messages import Notification, Request, Response, RpcError, parse_message

FAST = "subprocess"
marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")


def _peer_calls(peer: BlockingChannel, calls: list[tuple[str, Any]]) -> list[Any]:
    return [peer.call(method, params) for method, params in calls]


async def test_eager_handler_answers_without_a_task_and_in_its_own_context() -> None:
    seen: list[tuple[bool, str]] = []

    async def handler(method: str, params: Any) -> Any:
        seen.append((asyncio.current_task() is not None, marker.get()))
        marker.set(method)  # must not leak into the next request
        if method == "wait":
            await asyncio.sleep(0.01)  # goes on in a task from here
            seen.append((asyncio.current_task() is not None, marker.get()))
        elif method == "needs-task":
            await in_task()
            async with asyncio.timeout(5):  # needs a task
                await asyncio.sleep(0)
                seen.append((asyncio.current_task() is not None, marker.get()))
        elif method == "fail":
            raise ValueError("no")
        return [method, params]

    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    ch = await Channel.open(host_sock, requests=None)  # any method reaches the handler
    ch.serve_with(handler, eager=True)
    try:
        calls = [("now", 1), ("wait", 2), ("needs-task", 3), ("now", 4)]
        got = await asyncio.to_thread(_peer_calls, peer, calls)
        assert got == [["now", 1], ["wait", 2], ["needs-task", 3], ["now", 4]]
        assert seen == [
            (False, "unset"),
            (False, "unset"),
            (True, "wait"),  # the task carries the handler's context on
            (False, "unset"),
            (True, "needs-task"),
            (False, "unset"),
        ]
        with pytest.raises(Exception, match="ValueError: no"):
            await asyncio.to_thread(peer.call, "fail", None)
        assert not ch._tasks  # every task left the set as it ended
    finally:
        await ch.aclose()
        peer.close()


async def test_in_task_is_free_inside_a_task() -> None:
    await in_task()
    assert asyncio.current_task() is not None


async def eagerly(coro: Any, *, cancel: bool = False) -> asyncio.Task[Any] | None:
    """start_eagerly(coro) from a loop callback (outside any task), as the channel calls it.

    *cancel*: cancel the task in that same callback, before its first step.
    """
    loop = asyncio.get_running_loop()
    out: asyncio.Future[asyncio.Task[Any] | None] = loop.create_future()

    def start() -> None:
        try:
            task = start_eagerly(loop, coro)
            if cancel and task is not None:
                task.cancel()
            out.set_result(task)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.set_exception(exc)

    loop.call_soon(start)
    return await out


async def test_start_eagerly_steps_now_and_hands_over_to_a_task() -> None:
    log: list[tuple[str, bool]] = []

    def note(what: str) -> None:
        log.append((what, asyncio.current_task() is not None))

    async def quick() -> None:
        note("quick")

    assert await eagerly(quick()) is None
    assert log == [("quick", False)]

    async def steps() -> str:
        await asyncio.sleep(0)  # a bare yield: the task goes on at its first step
        note("after sleep(0)")
        return "done"

    async def needs_a_task() -> None:
        note("eager")
        await in_task()
        note("in task")
        async with asyncio.timeout(5):
            await asyncio.sleep(0)

    log.clear()
    task = await eagerly(steps())
    assert task is not None and await task == "done"
    task = await eagerly(needs_a_task())
    assert task is not None
    await task
    assert log == [("after sleep(0)", True), ("eager", False), ("in task", True)]

    async def fails() -> None:
        raise ValueError("first step")

    with pytest.raises(ValueError, match="first step"):
        await eagerly(fails())


async def test_start_eagerly_cancelled_before_its_first_task_step() -> None:
    seen: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled at its wait")
            raise

    task = await eagerly(waits(), cancel=True)  # before the task ever ran
    assert task is not None
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled at its wait"]


async def test_eager_handler_waiting_is_cancelled_on_close() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(method: str, params: Any) -> Any:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    ch = await Channel.open(host_sock, requests=None)
    ch.serve_with(handler, eager=True)
    call = asyncio.ensure_future(asyncio.to_thread(peer.call, "forever", None))
    await started.wait()
    await ch.aclose()
    assert cancelled.is_set()
    with pytest.raises(ConnectionError):
        await call
    peer.close()


async def test_abandoned_requests_are_dropped_and_swept() -> None:
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    ch = await Channel.open(host_sock)
    try:
        abandoned = []
        for i in range(MAX_PENDING_SWEEP + 10):
            abandoned.append(ch.request("x", i))
            abandoned[-1].cancel()  # abandoned at once: the sweep at 1,024 pending drops them
        live = ch.request("y", None)
        assert len(ch._pending) <= 11  # the sweep moved the abandoned ones out

        def answer_all() -> None:  # on a thread: the host must keep reading meanwhile
            for _ in abandoned:  # late answers to abandoned requests: dropped, not violations
                peer.respond(peer.next_request().id, None, "late")
            peer.respond(peer.next_request().id, None, "answer")

        await asyncio.to_thread(answer_all)
        assert await live == "answer"
        assert not ch.closed.done()
        # an answer to an id the host never sent is still a violation
        await asyncio.to_thread(peer.respond, 999_999, None, "forged")
        await asyncio.wait_for(ch.closed, 5)
        assert isinstance(ch.close_reason, ProtocolError)
    finally:
        await ch.aclose()
        peer.close()


async def test_many_live_requests_survive_the_sweeps() -> None:
    host_sock, peer_sock = socket.socketpair()
    peer = BlockingChannel(peer_sock)
    ch = await Channel.open(host_sock)
    count = 3 * MAX_PENDING_SWEEP
    try:
        live = [ch.request("x", i) for i in range(count)]  # sweeps find none to drop

        def answer_all() -> None:
            for _ in range(count):
                req = peer.next_request()
                peer.respond(req.id, None, req.params)

        await asyncio.to_thread(answer_all)
        assert await asyncio.gather(*live) == list(range(count))
        assert not ch._pending and not ch.closed.done()
    finally:
        await ch.aclose()
        peer.close()


def test_framer_matches_frame_and_recovers_from_failures() -> None:
    framer = Framer(max_frame=1 << 20, max_values=1000)
    message = [1, 7, None, {"text": "é", "n": [1, 2.5, b"x", None, True]}]
    assert framer.frame(message) == frame(message)
    with pytest.raises(WireError, match="cannot encode"):
        framer.frame([1, object()])
    assert framer.frame(message) == frame(message)  # nothing left over from the failure
    big = ["x" * 100_000]
    assert framer.frame(big) == frame(big)  # a large message gets a fresh packer after it
    assert framer.frame(message) == frame(message)
    with pytest.raises(WireError, match="exceeds"):
        framer.frame("x" * (1 << 20))
    with pytest.raises(WireError, match="more than 1000 values"):
        framer.frame(list(range(2000)))
    payload = framer.frame(message)[4:]
    assert msgpack.unpackb(payload) == message


def test_records_stay_small_frozen_values() -> None:
    err = RpcError("T", "m")
    assert err.data is None and err.to_wire() == {"type": "T", "message": "m", "data": None}
    assert Response(1, err, None) == Response(1, RpcError("T", "m", None), None)
    assert hash(Request(1, "m", None)) == hash(Request(1, "m", None))
    assert repr(Notification("n", 1)) == "Notification(method='n', params=1)"
    assert parse_message([0, 3, "execute", {}]) == Request(3, "execute", {})
    with pytest.raises(AttributeError):
        err.type = "other"


async def test_cancelled_execute_abandons_its_answer_and_the_kernel_goes_on() -> None:
    async with AsyncKernel(backend=FAST) as k:
        await k.execute("x = 1")
        slow = asyncio.ensure_future(k.execute("import time; time.sleep(0.3); x = 2; 'slow'"))
        await asyncio.sleep(0.1)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        r = await k.execute("x")  # the late answer to the cancelled cell is dropped
        assert r.ok and r.value == "2" and not r.state_lost, r
        assert k.restarts == 0
