"""Session budgets: :class:`Budget` (the limits) and :class:`BudgetTracker` (the spend).

Embedding calls (``embed``/``search``, :mod:`sunroom.embeddings.functions`) are counted by the
same tracker (:meth:`BudgetTracker.count_embedding_call`) against ``max_embedding_calls``, and
the bytes through the kernel's egress proxy (:meth:`BudgetTracker.charge_network`) against
``max_network_bytes``.

One tracker is shared by a session, its ``predict``/``predict_many`` sub-calls and any nested
sessions, so every model call anywhere counts against the same limits. A call is *reserved*
before it is made (so concurrent fan-out cannot overshoot ``max_model_calls``) and *recorded*
after; tokens and cost can overshoot by the calls already in flight.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import final

from sunroom.errors import BudgetExceededError, UsageError
from sunroom.providers import Response, Usage

__all__ = ["Budget", "BudgetTracker", "Spend"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Limits of a session; None means no limit.

    Attributes:
        max_model_calls: model calls (root turns, sub-calls, compaction).
        max_tokens: input plus output tokens.
        max_cost_micro_usd: cost in micro-USD; calls whose price is unknown add nothing.
        max_wall_s: seconds since the session started; past it a run ends with ``timeout``.
        max_embedding_calls: calls of the ``embed`` and ``search`` host functions (a session
            with ``embeddings=``); each call counts one, whatever its number of texts.
        max_network_bytes: bytes through the kernel's egress proxy, both directions (a
            session with ``network=``); the connection that crosses it is cut.
    """

    max_model_calls: int | None = None
    max_tokens: int | None = None
    max_cost_micro_usd: int | None = None
    max_wall_s: float | None = None
    max_embedding_calls: int | None = None
    max_network_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_model_calls",
            "max_tokens",
            "max_cost_micro_usd",
            "max_wall_s",
            "max_embedding_calls",
            "max_network_bytes",
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise UsageError(f"Budget.{name} must be positive or None, got {value!r}")


@final
@dataclass(frozen=True, slots=True)
class Spend:
    """A snapshot of what a tracker has counted.

    ``embedding_calls`` counts ``embed``/``search`` calls; ``network_bytes`` the bytes through
    the kernel's egress proxy.
    """

    model_calls: int = 0
    sub_calls: int = 0
    usage: Usage = Usage()
    cost_micro_usd: int = 0
    unpriced_calls: int = 0
    embedding_calls: int = 0
    network_bytes: int = 0

    @property
    def cost_known(self) -> bool:
        """Whether every counted call had a known price."""
        return self.unpriced_calls == 0

    def since(self, earlier: Spend) -> Spend:
        """What was spent between *earlier* and this snapshot."""
        u, e = self.usage, earlier.usage
        return Spend(
            model_calls=self.model_calls - earlier.model_calls,
            sub_calls=self.sub_calls - earlier.sub_calls,
            usage=Usage(
                input_tokens=u.input_tokens - e.input_tokens,
                output_tokens=u.output_tokens - e.output_tokens,
                cache_read_tokens=u.cache_read_tokens - e.cache_read_tokens,
                cache_write_tokens=u.cache_write_tokens - e.cache_write_tokens,
                cache_write_1h_tokens=u.cache_write_1h_tokens - e.cache_write_1h_tokens,
                reasoning_tokens=u.reasoning_tokens - e.reasoning_tokens,
            ),
            cost_micro_usd=self.cost_micro_usd - earlier.cost_micro_usd,
            unpriced_calls=self.unpriced_calls - earlier.unpriced_calls,
            embedding_calls=self.embedding_calls - earlier.embedding_calls,
            network_bytes=self.network_bytes - earlier.network_bytes,
        )


@final
class BudgetTracker:
    """Counts model calls, tokens, cost and wall time against a :class:`Budget`.

    Used from one event loop, except :meth:`charge_network`, which the egress and relay threads
    call (docs/network.md): every change of the totals holds a lock, so none is lost.
    ``exceeded`` holds the first limit hit.
    """

    def __init__(self, budget: Budget | None = None, *, spent: Spend | None = None) -> None:
        """Track *budget*; *spent* is what a resumed session had already spent (it counts)."""
        self.budget = budget or Budget()
        self.started = time.monotonic()
        self._spend = spent or Spend()
        self._spend_lock = threading.Lock()
        self._reserved = self._spend.model_calls
        self.exceeded: BudgetExceededError | None = None

    def snapshot(self) -> Spend:
        """What has been spent so far."""
        return self._spend

    def elapsed(self) -> float:
        """Seconds since the tracker was created."""
        return time.monotonic() - self.started

    def remaining_wall(self) -> float | None:
        """Seconds left before ``max_wall_s`` (never negative), or None without that limit."""
        if self.budget.max_wall_s is None:
            return None
        return max(0.0, self.budget.max_wall_s - self.elapsed())

    def _fail(self, limit: str, message: str) -> BudgetExceededError:
        exc = BudgetExceededError(message, limit=limit)
        if self.exceeded is None:
            self.exceeded = exc
        return exc

    def check(self) -> None:
        """Raise BudgetExceededError when any limit is already reached."""
        b, s = self.budget, self._spend
        if b.max_wall_s is not None and self.elapsed() >= b.max_wall_s:
            raise self._fail(
                "wall_time", f"the session's wall-time budget of {b.max_wall_s:g} s is spent"
            )
        if b.max_tokens is not None and s.usage.total_tokens >= b.max_tokens:
            raise self._fail(
                "tokens",
                f"the session's token budget is spent ({s.usage.total_tokens} of {b.max_tokens})",
            )
        if b.max_cost_micro_usd is not None and s.cost_micro_usd >= b.max_cost_micro_usd:
            raise self._fail(
                "cost",
                f"the session's cost budget is spent ({s.cost_micro_usd} of "
                f"{b.max_cost_micro_usd} micro-USD)",
            )
        if b.max_network_bytes is not None and s.network_bytes > b.max_network_bytes:
            raise self._fail(
                "network_bytes",
                f"the session's network budget of {b.max_network_bytes:,} bytes is spent",
            )

    def reserve(self) -> None:
        """Claim one model call; raise BudgetExceededError if no limit allows it.

        Pair every successful reserve with :meth:`record` or :meth:`release`.
        """
        self.check()
        b = self.budget
        if b.max_model_calls is not None and self._reserved >= b.max_model_calls:
            raise self._fail(
                "model_calls", f"the session's budget of {b.max_model_calls} model calls is spent"
            )
        self._reserved += 1

    def release(self) -> None:
        """Give back a reserved call that was never made (it failed before any usage)."""
        self._reserved = max(0, self._reserved - 1)

    def record(self, response: Response, *, sub_call: bool) -> Spend:
        """Count a finished call's usage and cost; return the new totals."""
        return self.record_usage(response.usage, response.cost_micro_usd, sub_call=sub_call)

    def record_usage(self, usage: Usage, cost_micro_usd: int | None, *, sub_call: bool) -> Spend:
        """Count one finished call by its usage and cost (None: unknown price)."""
        with self._spend_lock:
            s = self._spend
            self._spend = Spend(
                model_calls=s.model_calls + 1,
                sub_calls=s.sub_calls + (1 if sub_call else 0),
                usage=s.usage + usage,
                cost_micro_usd=s.cost_micro_usd + (cost_micro_usd or 0),
                unpriced_calls=s.unpriced_calls + (cost_micro_usd is None),
                embedding_calls=s.embedding_calls,
                network_bytes=s.network_bytes,
            )
            return self._spend

    def count_embedding_call(self) -> Spend:
        """Count one ``embed``/``search`` call before it runs; return the new totals.

        Raises BudgetExceededError (limit ``embedding_calls``) when ``max_embedding_calls`` are
        spent, or when any other limit is already reached (:meth:`check`); nothing is counted.
        """
        self.check()
        b, s = self.budget, self._spend
        if b.max_embedding_calls is not None and s.embedding_calls >= b.max_embedding_calls:
            raise self._fail(
                "embedding_calls",
                f"the session's budget of {b.max_embedding_calls} embedding calls is spent",
            )
        with self._spend_lock:
            s = self._spend
            self._spend = dataclasses.replace(s, embedding_calls=s.embedding_calls + 1)
            return self._spend

    def charge_network(self, size: int) -> bool:
        """Count *size* bytes through the egress proxy; False once the budget is passed.

        Past ``max_network_bytes`` the proxy cuts the connection, and :meth:`check` fails
        from then on.
        """
        with self._spend_lock:
            s = self._spend
            self._spend = dataclasses.replace(s, network_bytes=s.network_bytes + size)
            cap = self.budget.max_network_bytes
            return cap is None or self._spend.network_bytes <= cap
