"""Shared fixtures: which backends the conformance and security suites run on.

``SUNROOM_TEST_BACKENDS`` (default: all) picks the backends to run. A backend that cannot start
on this machine is skipped with the reason, unless it is listed in ``SUNROOM_REQUIRE_BACKENDS``
(CI lists all three): then its tests fail instead, so a missing backend in CI is a failure.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import psutil
import pytest

from sunroom import AsyncKernel
from sunroom.errors import SandboxUnavailableError

ALL_BACKENDS = ("subprocess", "bwrap", "docker")
ISOLATED_BACKENDS = ("bwrap", "docker")

_availability: dict[str, str | None] = {}


def _names(var: str, default: str) -> list[str]:
    return [b.strip() for b in os.environ.get(var, default).split(",") if b.strip()]


def backends_under_test(among: tuple[str, ...] = ALL_BACKENDS) -> list[str]:
    return [b for b in _names("SUNROOM_TEST_BACKENDS", ",".join(ALL_BACKENDS)) if b in among]


def _unavailable_reason(name: str) -> str | None:
    if name not in _availability:

        async def probe() -> None:
            async with AsyncKernel(backend=name) as k:
                r = await k.execute("1")
                assert r.ok, r

        try:
            asyncio.run(probe())
            _availability[name] = None
        except SandboxUnavailableError as exc:
            _availability[name] = str(exc)
    return _availability[name]


def _require(name: str) -> str:
    reason = _unavailable_reason(name)
    if reason is not None:
        if name in _names("SUNROOM_REQUIRE_BACKENDS", ""):
            pytest.fail(f"required backend {name!r} is unavailable: {reason}")
        pytest.skip(f"backend {name!r} unavailable here: {reason}")
    return name


@pytest.fixture(params=backends_under_test())
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend under test (kernel conformance)."""
    return _require(request.param)


@pytest.fixture(params=backends_under_test(ISOLATED_BACKENDS))
def isolated_backend(request: pytest.FixtureRequest) -> str:
    """The isolating backends under test (security suite)."""
    return _require(request.param)


def _descendants() -> set[int]:
    """This process's descendants, but the docker watchdog (one per host process, by design)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if not any("docker_watchdog" in part for part in p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _live(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def no_process_left() -> Iterator[None]:
    """Every process a test started is gone when it ends."""
    before = _descendants()
    yield
    deadline = time.monotonic() + 10
    while (left := _live(_descendants() - before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(left)}"
