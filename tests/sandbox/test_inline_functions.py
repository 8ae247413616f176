"""How sync host functions run: inline on the event loop (opt-in) or on a warm thread.

No timing assertions here: the speed of each mode is measured by benchmarks/kernel.py. These
tests pin down where each call runs and that timeouts, limits and budgets behave as documented.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sunroom import AsyncKernel, Kernel, UsageError, host_function
from sunroom.errors import HostFunctionTimeout
from sunroom.sandbox.functions import FunctionRegistry, HostFunction

FAST = "subprocess"


def test_inline_is_typed_and_recorded() -> None:
    def double(x: int) -> int:
        return 2 * x

    with_options: HostFunction = host_function(inline=True, timeout_s=1)(double)
    bare: HostFunction = host_function(double)
    assert with_options.inline and with_options.timeout_s == 1
    assert not bare.inline


def test_inline_is_for_sync_functions_only() -> None:
    async def on_the_loop_already() -> int:
        return 1

    with pytest.raises(UsageError, match="inline=True is for sync functions"):
        host_function(on_the_loop_already, inline=True)


async def test_inline_runs_on_the_loop_thread_without_a_task() -> None:
    seen: list[tuple[int, bool]] = []

    @host_function(inline=True)
    def where(x: int) -> int:
        seen.append((threading.get_ident(), asyncio.current_task() is not None))
        return x + 1

    reg = FunctionRegistry([where])
    assert await reg.invoke("where", {"x": 1}) == 2
    assert seen == [(threading.get_ident(), True)]  # awaited from this test's task

    # served by a kernel, the call runs eagerly: on the loop thread and outside any task
    seen.clear()
    async with AsyncKernel(backend=FAST, functions=[where]) as k:
        r = await k.execute("[where(i) for i in range(3)]")
    assert r.ok and r.value == "[1, 2, 3]", r
    assert seen == [(threading.get_ident(), False)] * 3


async def test_inline_timeout_discards_a_late_result() -> None:
    @host_function(inline=True, timeout_s=0.01)
    def slow() -> str:
        time.sleep(0.05)  # what an inline function must not do: it holds the loop
        return "too late"

    reg = FunctionRegistry([slow])
    with pytest.raises(HostFunctionTimeout):
        await reg.invoke("slow", {})
    async with AsyncKernel(backend=FAST, functions=[slow]) as k:
        r = await k.execute("slow()")
    assert r.error is not None and r.error.type == "HostFunctionTimeout", r


async def test_inline_errors_budget_and_concurrency() -> None:
    running = 0
    peak = 0

    @host_function(inline=True, budget=40, max_concurrency=1)
    def checked(x: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        running -= 1
        if x < 0:
            raise ValueError("negative")
        return x

    async with AsyncKernel(backend=FAST, functions=[checked]) as k:
        r = await k.execute(
            "from concurrent.futures import ThreadPoolExecutor\n"
            "with ThreadPoolExecutor(8) as ex:\n"
            "    out = list(ex.map(checked, range(32)))\n"
            "sum(out)"
        )
        assert r.ok and r.value == str(sum(range(32))), r
        assert peak == 1  # inline calls run one at a time, on the loop
        r = await k.execute("checked(-1)")
        assert r.error is not None and r.error.type == "ValueError", r
        r = await k.execute("checked('x')")
        assert r.error is not None and r.error.type == "HostFunctionArgumentError", r
        r = await k.execute("[checked(i) for i in range(10)]")
        assert r.error is not None and r.error.type == "HostFunctionBudgetExceeded", r


async def test_sync_calls_reuse_a_warm_thread_off_the_loop() -> None:
    threads: list[int] = []

    def where() -> None:
        threads.append(threading.get_ident())

    reg = FunctionRegistry([where])
    try:
        for _ in range(5):
            await reg.invoke("where", {})
        assert threading.get_ident() not in threads
        assert len(set(threads)) == 1  # one warm thread, no pool hop per call
    finally:
        reg.close()


async def test_sync_calls_do_not_queue_behind_a_busy_warm_thread() -> None:
    release = threading.Event()
    all_running = threading.Barrier(4)

    def block(i: int) -> int:
        all_running.wait(10)  # passes only once all four run at once
        assert release.wait(10)
        return i

    reg = FunctionRegistry([block])
    try:
        calls = [asyncio.ensure_future(reg.invoke("block", {"i": i})) for i in range(4)]
        await asyncio.sleep(0)
        release.set()
        assert await asyncio.gather(*calls) == [0, 1, 2, 3]
    finally:
        release.set()
        reg.close()


async def test_sync_max_concurrency_limits_running_threads() -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    @host_function(max_concurrency=2)
    def limited() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    reg = FunctionRegistry([limited])
    try:
        await asyncio.gather(*(reg.invoke("limited", {}) for _ in range(8)))
    finally:
        reg.close()
    assert peak == 2  # a call's thread starts only once the call holds the limit


async def test_sync_timeout_leaves_the_thread_and_the_next_call_goes_on() -> None:
    release = threading.Event()

    @host_function(timeout_s=0.05)
    def stuck(wait: bool) -> str:
        if wait:
            release.wait(10)
        return "done"

    reg = FunctionRegistry([stuck])
    try:
        with pytest.raises(HostFunctionTimeout):
            await reg.invoke("stuck", {"wait": True})
        # the warm thread is still stuck in the first call; this one runs on the pool
        assert await reg.invoke("stuck", {"wait": False}) == "done"
    finally:
        release.set()
        reg.close()


def test_closing_the_registry_ends_its_warm_thread() -> None:
    def where() -> int:
        return threading.get_ident()

    reg = FunctionRegistry([where])
    ident = asyncio.run(reg.invoke("where", {}))
    warm = [t for t in threading.enumerate() if t.ident == ident]
    assert len(warm) == 1 and warm[0].name == "sunroom-hostfn-warm"
    reg.close()
    warm[0].join(5)
    assert not warm[0].is_alive()
    assert asyncio.run(reg.invoke("where", {})) != ident  # after close: the shared pool


def test_sync_twin_serves_inline_and_threaded_functions() -> None:
    @host_function(inline=True)
    def fast(x: int) -> int:
        return x + 1

    def threaded(x: int) -> int:
        return x * 2

    with Kernel(backend=FAST, functions=[fast, threaded]) as k:
        r = k.execute("fast(1), threaded(2)")
    assert r.ok and r.value == "(2, 4)", r
