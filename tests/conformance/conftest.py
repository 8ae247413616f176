"""Fixtures of the fork and template conformance cases."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest

from tests.conftest import _require, backends_under_test

FORK_BACKENDS = backends_under_test(("subprocess", "bwrap", "docker"))


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


@pytest.fixture(params=FORK_BACKENDS)
def fork_backend(request: pytest.FixtureRequest) -> str:
    """The backends whose kernels fork (checked before any loop runs)."""
    return _require(request.param)
