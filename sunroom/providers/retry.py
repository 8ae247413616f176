"""Retries with backoff for retryable provider errors, and a circuit breaker per model.

Both take a :class:`Clock`, so tests run them on virtual time: no real sleeping.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar, final

from sunroom.errors import (
    CircuitOpenError,
    OverloadedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitedError,
    UsageError,
)

__all__ = ["CircuitBreaker", "Clock", "RetryPolicy", "call_with_retry"]

T = TypeVar("T")


@final
@dataclass(frozen=True, slots=True)
class Clock:
    """The time source used by retries and breakers; replace it in tests.

    ``now`` is monotonic seconds, ``sleep`` an async sleep, ``random`` a uniform draw in
    ``[0, 1)`` for jitter.
    """

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    random: Callable[[], float] = random.random


@final
@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How to retry a failed call.

    Only errors whose class is ``retryable`` (rate limited, overloaded, timeout, connection)
    are retried. The wait before retry ``n`` (1-based) is drawn from
    ``[d/2, d]`` with ``d = min(max_backoff, initial_backoff * multiplier**(n-1))`` ("equal
    jitter"); a vendor's ``retry_after`` raises the wait to at least that. A wait that would
    end past ``deadline`` (seconds since the call began, waits and attempts included) is not
    taken: the last error is raised at once. Each attempt's own timeout is also cut to the
    time left before the deadline.

    ``RetryPolicy(max_attempts=1)`` disables retries.
    """

    max_attempts: int = 4
    initial_backoff: float = 0.5
    max_backoff: float = 20.0
    multiplier: float = 2.0
    deadline: float | None = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UsageError("RetryPolicy.max_attempts must be at least 1")
        if self.deadline is not None and self.deadline <= 0:
            raise UsageError("RetryPolicy.deadline must be positive")

    def backoff(self, retry: int, draw: float) -> float:
        """Return the wait before retry number ``retry`` (1-based) for a draw in ``[0, 1)``."""
        ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier ** (retry - 1))
        return ceiling / 2 + draw * ceiling / 2


BreakerState = Literal["closed", "open", "half_open"]

# Errors that say the endpoint is unhealthy; anything else (a 400, a 401, a 429) proves it
# answered and counts as a success for the breaker.
_UNHEALTHY = (OverloadedError, ProviderTimeoutError, ProviderConnectionError)


@final
class CircuitBreaker:
    """Fails calls fast after ``failure_threshold`` consecutive unhealthy attempts.

    Unhealthy means overloaded, timed out or unreachable. When open, calls raise
    :class:`~sunroom.errors.CircuitOpenError` without touching the network until
    ``reset_after`` seconds have passed; then one probe call is let through (half-open): its
    success closes the circuit, its failure opens it again. Safe to share between the tasks
    of one event loop.
    """

    __slots__ = ("_failures", "_opened_at", "_probing", "clock", "failure_threshold", "reset_after")

    def __init__(
        self, *, failure_threshold: int = 5, reset_after: float = 30.0, clock: Clock | None = None
    ) -> None:
        if failure_threshold < 1:
            raise UsageError("CircuitBreaker.failure_threshold must be at least 1")
        self.failure_threshold = failure_threshold
        self.reset_after = reset_after
        self.clock = clock or Clock()
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker(state={self.state!r}, failures={self._failures}, "
            f"failure_threshold={self.failure_threshold}, reset_after={self.reset_after})"
        )

    @property
    def state(self) -> BreakerState:
        """``closed``, ``open`` or ``half_open`` (a probe may go, or is in flight)."""
        if self._opened_at is None:
            return "closed"
        if self._probing or self.clock.now() - self._opened_at >= self.reset_after:
            return "half_open"
        return "open"

    def acquire(self, provider: str = "") -> bool:
        """Admit one attempt or raise CircuitOpenError; True when the attempt is the probe."""
        if self._opened_at is None:
            return False
        if not self._probing and self.clock.now() - self._opened_at >= self.reset_after:
            self._probing = True
            return True
        wait = max(self.reset_after - (self.clock.now() - self._opened_at), 0.0)
        raise CircuitOpenError(
            f"circuit open after {self._failures} consecutive failures; next probe in {wait:.1f}s",
            provider=provider,
        )

    def record(self, error: BaseException | None, *, probe: bool) -> None:
        """Record an attempt's outcome (``None`` for success)."""
        if probe:
            self._probing = False
        if isinstance(error, _UNHEALTHY):
            self._failures += 1
            if self._opened_at is not None or self._failures >= self.failure_threshold:
                self._opened_at = self.clock.now()
        elif error is None or isinstance(error, ProviderError):
            self._failures = 0
            self._opened_at = None

    def release(self) -> None:
        """End a probe that finished without a verdict (it was cancelled)."""
        self._probing = False

    def reset(self) -> None:
        """Close the circuit and forget past failures."""
        self._failures = 0
        self._opened_at = None
        self._probing = False


async def call_with_retry(
    attempt: Callable[[float | None], Awaitable[T]],
    *,
    policy: RetryPolicy,
    breaker: CircuitBreaker | None,
    clock: Clock,
    limit: float | None,
    provider: str = "",
    record_success: bool = True,
) -> T:
    """Run ``attempt(time_limit)`` under ``policy`` and ``breaker``.

    ``limit`` is each attempt's time limit in seconds (cut to the time left before the
    policy's deadline). With ``record_success=False`` a success is left for the caller to
    record (a stream is healthy only once it has ended well).

    ``attempt`` must raise only :class:`~sunroom.errors.ProviderError` (translate first).
    Raises the last error when attempts, or the deadline, run out; raises
    :class:`~sunroom.errors.CircuitOpenError` when the breaker is open.
    """
    start = clock.now()
    retry = 0
    while True:
        remaining = None if policy.deadline is None else policy.deadline - (clock.now() - start)
        if remaining is not None and remaining <= 0:
            raise ProviderTimeoutError(
                f"retry deadline of {policy.deadline}s passed", provider=provider
            )
        this_limit = limit if remaining is None else min(limit or remaining, remaining)
        probe = breaker.acquire(provider) if breaker is not None else False
        error: ProviderError | None = None
        try:
            result = await attempt(this_limit)
        except ProviderError as exc:
            error = exc
        finally:
            if breaker is not None:
                if error is not None:
                    breaker.record(error, probe=probe)
                elif probe:
                    # Success (recorded below) or cancellation: the probe is over.
                    breaker.release()
        if error is None:
            if breaker is not None and record_success:
                breaker.record(None, probe=False)
            return result
        retry += 1
        if not error.retryable or retry >= policy.max_attempts:
            raise error
        if breaker is not None and breaker.state == "open":
            raise error  # this failure opened the circuit: report it, not CircuitOpenError
        wait = policy.backoff(retry, clock.random())
        if isinstance(error, RateLimitedError) and error.retry_after is not None:
            wait = max(wait, error.retry_after)
        if policy.deadline is not None and clock.now() - start + wait >= policy.deadline:
            raise error
        await clock.sleep(wait)
