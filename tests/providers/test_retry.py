from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from sunroom.errors import (
    BadRequestError,
    CircuitOpenError,
    OverloadedError,
    ProviderConnectionError,
    ProviderTimeoutError,
    RateLimitedError,
    UsageError,
)
from sunroom.providers import CircuitBreaker, OpenAIChatModel, Request, RetryPolicy, UserMessage
from sunroom.providers.retry import BreakerState, call_with_retry

from .conftest import FakeTime
from .replay import ReplayServer, json_reply, reply_from

Attempt = Callable[[float | None], Awaitable[str]]


def failing(*errors: Exception, result: str = "ok") -> tuple[list[float | None], Attempt]:
    """An attempt function raising ``errors`` in turn, then returning ``result``."""
    limits: list[float | None] = []
    queue = list(errors)

    async def attempt(limit: float | None) -> str:
        limits.append(limit)
        if queue:
            raise queue.pop(0)
        return result

    return limits, attempt


def state_of(breaker: CircuitBreaker) -> BreakerState:
    """``breaker.state`` read afresh: a call, so an earlier assert does not narrow it
    (the state moves with the clock, which mypy cannot see)."""
    return breaker.state


def test_backoff_is_exponential_with_equal_jitter() -> None:
    policy = RetryPolicy(initial_backoff=1, multiplier=2, max_backoff=5)
    assert [policy.backoff(n, 0.0) for n in (1, 2, 3, 4)] == [0.5, 1, 2, 2.5]
    assert [policy.backoff(n, 0.999999) for n in (1, 2, 3, 4)] == pytest.approx([1, 2, 4, 5])


def test_policy_validation() -> None:
    with pytest.raises(UsageError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(UsageError):
        RetryPolicy(deadline=0)


async def test_retries_retryable_errors_then_succeeds(fake_time: FakeTime) -> None:
    limits, attempt = failing(OverloadedError("x"), ProviderConnectionError("y"))
    result = await call_with_retry(
        attempt, policy=RetryPolicy(), breaker=None, clock=fake_time.clock, limit=30
    )
    assert result == "ok"
    assert fake_time.sleeps == [0.375, 0.75]
    assert limits == [30, 30, 30]


async def test_non_retryable_raises_at_once(fake_time: FakeTime) -> None:
    limits, attempt = failing(BadRequestError("bad"))
    with pytest.raises(BadRequestError):
        await call_with_retry(
            attempt, policy=RetryPolicy(), breaker=None, clock=fake_time.clock, limit=None
        )
    assert len(limits) == 1 and fake_time.sleeps == []


async def test_gives_up_after_max_attempts(fake_time: FakeTime) -> None:
    limits, attempt = failing(*[OverloadedError(str(i)) for i in range(10)])
    with pytest.raises(OverloadedError, match="2"):
        await call_with_retry(
            attempt,
            policy=RetryPolicy(max_attempts=3),
            breaker=None,
            clock=fake_time.clock,
            limit=None,
        )
    assert len(limits) == 3


async def test_retry_after_raises_the_wait(fake_time: FakeTime) -> None:
    _, attempt = failing(RateLimitedError("slow", retry_after=9.5))
    await call_with_retry(
        attempt, policy=RetryPolicy(), breaker=None, clock=fake_time.clock, limit=None
    )
    assert fake_time.sleeps == [9.5]


async def test_deadline_bounds_waits_and_attempt_limits(fake_time: FakeTime) -> None:
    policy = RetryPolicy(deadline=10, max_attempts=10)
    limits, attempt = failing(
        RateLimitedError("slow", retry_after=4),
        RateLimitedError("slow", retry_after=4),
        RateLimitedError("again", retry_after=4),
    )
    with pytest.raises(RateLimitedError, match="again"):
        await call_with_retry(attempt, policy=policy, breaker=None, clock=fake_time.clock, limit=30)
    # 0 + 4 + 4 = 8 s spent; a third 4 s wait would pass the 10 s deadline: give up at once.
    assert fake_time.sleeps == [4, 4]
    assert limits == [10, 6, 2]  # each attempt's limit is cut to the time left


async def test_breaker_opens_fails_fast_and_recovers(fake_time: FakeTime) -> None:
    breaker = CircuitBreaker(failure_threshold=2, reset_after=30, clock=fake_time.clock)
    one = RetryPolicy(max_attempts=1)
    for _ in range(2):
        _, attempt = failing(ProviderTimeoutError("t"))
        with pytest.raises(ProviderTimeoutError):
            await call_with_retry(
                attempt, policy=one, breaker=breaker, clock=fake_time.clock, limit=None
            )
    assert state_of(breaker) == "open"
    limits, attempt = failing()
    with pytest.raises(CircuitOpenError, match="next probe in 30.0s"):
        await call_with_retry(
            attempt, policy=one, breaker=breaker, clock=fake_time.clock, limit=None
        )
    assert limits == []  # failed fast, never attempted
    fake_time.t += 30
    assert state_of(breaker) == "half_open"
    # A failed probe opens it again at once.
    _, attempt = failing(OverloadedError("still down"))
    with pytest.raises(OverloadedError):
        await call_with_retry(
            attempt, policy=one, breaker=breaker, clock=fake_time.clock, limit=None
        )
    assert state_of(breaker) == "open"
    fake_time.t += 30
    _, attempt = failing()
    assert (
        await call_with_retry(
            attempt, policy=one, breaker=breaker, clock=fake_time.clock, limit=None
        )
        == "ok"
    )
    assert state_of(breaker) == "closed"


async def test_breaker_lets_one_probe_at_a_time(fake_time: FakeTime) -> None:
    breaker = CircuitBreaker(failure_threshold=1, reset_after=5, clock=fake_time.clock)
    breaker.record(OverloadedError("x"), probe=False)
    fake_time.t += 5
    gate = asyncio.Event()

    async def slow(limit: float | None) -> str:
        await gate.wait()
        return "ok"

    one = RetryPolicy(max_attempts=1)
    probe = asyncio.create_task(
        call_with_retry(slow, policy=one, breaker=breaker, clock=fake_time.clock, limit=None)
    )
    await asyncio.sleep(0)
    with pytest.raises(CircuitOpenError):
        await call_with_retry(slow, policy=one, breaker=breaker, clock=fake_time.clock, limit=None)
    gate.set()
    assert await probe == "ok"
    assert breaker.state == "closed"


async def test_cancelled_probe_releases_the_breaker(fake_time: FakeTime) -> None:
    breaker = CircuitBreaker(failure_threshold=1, reset_after=5, clock=fake_time.clock)
    breaker.record(OverloadedError("x"), probe=False)
    fake_time.t += 5

    async def hang(limit: float | None) -> str:
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(
        call_with_retry(
            hang, policy=RetryPolicy(), breaker=breaker, clock=fake_time.clock, limit=None
        )
    )
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.state == "half_open"  # the next call may probe
    _, attempt = failing()
    assert (
        await call_with_retry(
            attempt, policy=RetryPolicy(), breaker=breaker, clock=fake_time.clock, limit=None
        )
        == "ok"
    )


def test_client_errors_do_not_trip_the_breaker() -> None:
    breaker = CircuitBreaker(failure_threshold=1)
    breaker.record(BadRequestError("bad"), probe=False)
    breaker.record(RateLimitedError("slow"), probe=False)
    assert breaker.state == "closed"


async def test_dead_endpoint_fails_fast(fake_time: FakeTime) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    breaker = CircuitBreaker(failure_threshold=3, reset_after=60, clock=fake_time.clock)
    async with OpenAIChatModel(
        "m", base_url=f"http://127.0.0.1:{port}/v1", breaker=breaker, clock=fake_time.clock
    ) as m:
        with pytest.raises(ProviderConnectionError):
            await m.complete(Request([UserMessage("hi")]))  # 3 attempts, each refused
        assert breaker.state == "open"
        with pytest.raises(CircuitOpenError):
            await m.complete(Request([UserMessage("hi")]))


async def test_breaker_counts_stream_failures(server: ReplayServer, fake_time: FakeTime) -> None:
    path = "/v1/chat/completions"
    server.add(path, reply_from("openai/chat_text_stream", mode="cut", cut_after=2), times=None)
    breaker = CircuitBreaker(failure_threshold=2, clock=fake_time.clock)
    async with OpenAIChatModel(
        "m", base_url=server.url + "/v1", breaker=breaker, clock=fake_time.clock
    ) as m:
        for _ in range(2):
            with pytest.raises(ProviderConnectionError):
                async for _event in m.stream(Request([UserMessage("hi")])):
                    pass
        with pytest.raises(CircuitOpenError):
            await m.complete(Request([UserMessage("hi")]))
    assert len(server.requests) == 2


async def test_server_errors_retried_through_adapter(
    server: ReplayServer, fake_time: FakeTime
) -> None:
    path = "/v1/chat/completions"
    error = {
        "error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}
    }
    server.add(path, json_reply(503, error), times=3)
    server.add(path, reply_from("openai/chat_text"))
    async with OpenAIChatModel("m", base_url=server.url + "/v1", clock=fake_time.clock) as m:
        response = await m.complete(Request([UserMessage("hi")]))
    assert response.finish_reason == "stop"
    assert len(server.requests) == 4
    assert [r.headers.get("x-stainless-retry-count") for r in server.requests] == [
        "0"
    ] * 4  # SDK retries off
