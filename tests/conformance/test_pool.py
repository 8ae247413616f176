"""Warm kernel pools: fast starts and restarts, never a kernel handed out twice."""

from __future__ import annotations

import time

import pytest

from sunroom import AsyncKernel, Limits, UsageError
from sunroom.sandbox.pool import KernelPool


async def test_pooled_kernels_start_warm_and_never_share_state(backend: str) -> None:
    limits = Limits(timeout_s=1, interrupt_grace_s=0.3)
    async with KernelPool(backend=backend, limits=limits, size=2) as pool:
        await pool.wait_ready()
        for i in range(3):
            started = time.monotonic()
            async with AsyncKernel(pool=pool, inputs={"i": i}) as k:
                warm_start = time.monotonic() - started
                r = await k.execute("leak")  # a fresh kernel: nothing from the last user
                assert r.error is not None and r.error.type == "NameError"
                r = await k.execute("leak = 'secret'\ni")
                assert r.value == str(i)
            await pool.wait_ready()
            assert warm_start < 5
        assert pool.cold_starts == 0


async def test_restart_after_timeout_takes_a_warm_kernel(backend: str) -> None:
    limits = Limits(timeout_s=1, interrupt_grace_s=0.3)
    async with KernelPool(backend=backend, limits=limits, size=1) as pool:
        await pool.wait_ready()
        async with AsyncKernel(pool=pool, inputs={"given": 3}) as k:
            await pool.wait_ready()
            r = await k.execute(
                "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
            )
            assert r.status == "timeout" and r.state_lost
            assert (await k.execute("given")).value == "3"
        assert pool.cold_starts == 0


async def test_pool_options_are_checked(backend: str) -> None:
    with pytest.raises(UsageError):
        KernelPool(backend=backend, size=0)
    async with KernelPool(backend=backend, size=1) as pool:
        with pytest.raises(UsageError, match="limits"):
            AsyncKernel(pool=pool, limits=Limits(timeout_s=3))
