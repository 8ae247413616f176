"""Typed host functions called from inside real kernels."""

from __future__ import annotations

import asyncio
import datetime
import enum
import threading
import time

import pydantic

from sunroom import AsyncKernel, Limits, host_function


class Currency(enum.Enum):
    USD = "USD"
    EUR = "EUR"


class Quote(pydantic.BaseModel):
    """A price quote."""

    ticker: str
    price: float
    currency: Currency = Currency.USD
    at: datetime.datetime | None = None
    tags: list[str] = []


class Order(pydantic.BaseModel):
    ticker: str
    quantity: int = pydantic.Field(gt=0)


def lookup(ticker: str, *, currency: Currency = Currency.USD) -> Quote:
    """Look up the latest quote for a ticker."""
    if ticker == "NONE":
        raise KeyError(ticker)
    return Quote(
        ticker=ticker,
        price=101.5,
        currency=currency,
        at=datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
        tags=["a"],
    )


async def place(order: Order, quotes: list[Quote]) -> dict[str, float]:
    """Place an order (async, side-effecting)."""
    await asyncio.sleep(0)
    return {"total": order.quantity * quotes[0].price}


async def test_typed_round_trip_with_models(backend: str) -> None:
    async with AsyncKernel(backend=backend, functions=[lookup, place]) as k:
        r = await k.execute(
            "q = lookup('AAPL', currency=Currency.EUR)\n"
            "(type(q).__name__, q.price, q.currency, q.at.year, q.tags)"
        )
        assert r.ok, r.error
        assert r.value == "('Quote', 101.5, <Currency.EUR: 'EUR'>, 2026, ['a'])"
        r = await k.execute("place(Order(ticker='AAPL', quantity=3), [q])")
        assert r.ok, r.error
        assert r.value == "{'total': 304.5}"
        r = await k.execute("import inspect\nstr(inspect.signature(lookup)), lookup.__doc__")
        assert r.value == (
            "(\"(ticker: str, *, currency: __main__.Currency = <Currency.USD: 'USD'>) -> "
            "__main__.Quote\", 'Look up the latest quote for a ticker.')"
        ) or "ticker: str" in (r.value or "")


async def test_validation_error_is_readable_inside(backend: str) -> None:
    async with AsyncKernel(backend=backend, functions=[lookup, place]) as k:
        r = await k.execute("place({'ticker': 'X', 'quantity': 0}, [])")
        assert r.error is not None
        assert r.error.type == "HostFunctionArgumentError"
        assert "order.quantity: Input should be greater than 0 (got 0)" in r.error.message
        r = await k.execute("try:\n    lookup(5)\nexcept TypeError as e:\n    print('caught', e)")
        assert r.ok and "ticker: Input should be a valid string" in r.stdout
        r = await k.execute("lookup('NONE')")
        assert r.error is not None and r.error.type == "KeyError"


async def test_calls_from_many_kernel_threads(backend: str) -> None:
    seen: set[int] = set()
    lock = threading.Lock()

    def tick(i: int) -> int:
        with lock:
            seen.add(i)
        time.sleep(0.05)
        return i * 2

    async with AsyncKernel(backend=backend, functions=[tick]) as k:
        started = time.monotonic()
        r = await k.execute(
            "from concurrent.futures import ThreadPoolExecutor\n"
            "with ThreadPoolExecutor(16) as ex:\n"
            "    out = list(ex.map(tick, range(32)))\n"
            "sum(out)"
        )
        assert r.ok and r.value == str(sum(i * 2 for i in range(32)))
        assert len(seen) == 32
        assert time.monotonic() - started < 32 * 0.05  # they ran concurrently


async def test_timeout_budget_and_concurrency(backend: str) -> None:
    running = 0
    peak = 0

    # host_function(...) is typed as returning Any in sunroom/sandbox/functions.py (needs
    # overloads); drop these ignores once it returns Callable[[Callable[..., Any]], HostFunction].
    @host_function(max_concurrency=2)
    async def limited() -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return peak

    @host_function(timeout_s=0.2)
    async def slow() -> None:
        await asyncio.sleep(5)

    @host_function(budget=2, name="twice")
    def counted() -> str:
        return "ok"

    async with AsyncKernel(backend=backend, functions=[limited, slow, counted]) as k:
        r = await k.execute(
            "from concurrent.futures import ThreadPoolExecutor\n"
            "with ThreadPoolExecutor(8) as ex:\n"
            "    max(ex.map(lambda _: limited(), range(8)))"
        )
        assert r.ok, r.error
        assert peak == 2
        r = await k.execute("slow()")
        assert r.error is not None and r.error.type == "HostFunctionTimeout"
        r = await k.execute("twice(), twice()")
        assert r.ok
        r = await k.execute("twice()")
        assert r.error is not None and r.error.type == "HostFunctionBudgetExceeded"


async def test_host_call_interrupted_by_timeout(backend: str) -> None:
    async def forever() -> None:
        await asyncio.sleep(60)

    async with AsyncKernel(backend=backend, functions=[forever], limits=Limits(timeout_s=0.5)) as k:
        await k.execute("x = 1")
        r = await k.execute("forever()")
        assert r.status == "timeout" and not r.state_lost
        assert (await k.execute("x")).value == "1"


async def test_bound_model_inputs_arrive_as_mirrors(backend: str) -> None:
    quote = Quote(ticker="T", price=2.0)
    async with AsyncKernel(backend=backend, functions=[lookup], inputs={"quote": quote}) as k:
        r = await k.execute("type(quote).__name__, quote.price, quote.currency")
        assert r.ok and r.value == "('Quote', 2.0, <Currency.USD: 'USD'>)"


async def test_sync_functions_respect_the_concurrency_limit_and_busy_is_reported(
    backend: str,
) -> None:
    """A sync function starts only once it holds a slot; a wait that runs out is Busy."""
    lock = threading.Lock()
    running = 0
    peak = 0

    def work(seconds: float) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(seconds)
        with lock:
            running -= 1
        return peak

    limited = host_function(work, name="limited", max_concurrency=2, timeout_s=5)
    hog = host_function(work, name="hog", max_concurrency=1, timeout_s=0.3)
    async with AsyncKernel(backend=backend, functions=[limited, hog]) as k:
        r = await k.execute(
            "from concurrent.futures import ThreadPoolExecutor\n"
            "with ThreadPoolExecutor(6) as ex:\n"
            "    max(ex.map(lambda _: limited(0.05), range(6)))"
        )
        assert r.ok, r.error
        assert peak == 2  # never more than two ran at once
        r = await k.execute(
            # A holds the only slot for 0.25 s, then B (queued first) for 0.25 s more: the
            # third call's wait for a slot (at most timeout_s = 0.3 s) runs out first
            "import threading, time\n"
            "from sunroom.prelude.hostcall import HostFunctionBusy\n"
            "ts = [threading.Thread(target=lambda: hog(0.25)) for _ in range(2)]\n"
            "for t in ts:\n"
            "    t.start(); time.sleep(0.02)\n"
            "try:\n"
            "    hog(0.01)\n"
            "    seen = 'ran'\n"
            "except HostFunctionBusy as e:\n"
            "    seen = type(e).__name__\n"
            "for t in ts:\n"
            "    t.join()\n"
            "seen"
        )
        assert r.ok, r.error
        assert r.value == "'HostFunctionBusy'"
