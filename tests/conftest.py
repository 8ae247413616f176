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

ALL_BACKENDS = ("subprocess", "bwrap", "docker", "jupyter")
ISOLATED_BACKENDS = ("bwrap", "docker")
THREAT_BACKENDS = ("bwrap", "docker", "jupyter")
"""Where the core threat suite (tests/security/test_threats.py) runs: ``jupyter`` is an
IPython kernel in bwrap, under the same sandbox."""

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


JUPYTER_EXCEPTIONS: dict[str, str] = {
    "test_exception_is_data_with_user_frames_only": (
        "IPython formats tracebacks itself (context lines, 'Cell In[n]'), not sunroom's way"
    ),
    "test_base_exceptions_do_not_desync[jupyter-exit()]": (
        "exit() is IPython's: it asks the kernel to end after the cell, which is not an error"
    ),
    "test_memory_limit_holds": (
        "ipykernel's threads reserve more address space than this test's 512 MB; "
        "tests/sandbox/backends/jupyter/test_jupyter_backend.py checks the memory limit with room for them"
    ),
    "test_a_broken_repr_is_reported_and_never_fails_the_cell": (
        "IPython renders reprs itself: a broken one is a FormatterWarning on stderr, and a "
        "_repr_png_ of the wrong type fails the cell, instead of sunroom's metadata errors"
    ),
    "test_open_figures_are_captured_as_png_and_closed": (
        "figures are drawn by IPython's inline backend (its size, dpi and tight bbox)"
    ),
    "test_a_figure_too_large_to_render_is_said_and_the_kernel_works": (
        "IPython's inline backend fails the cell with matplotlib's own error"
    ),
    "test_figures_are_rgb_when_opaque_rgba_when_not_and_renderers_are_reused": (
        "IPython's inline backend always draws RGBA PNGs"
    ),
    "test_open_shared_on_forked_kernels_takes_each_ones_own_file": (
        "Jupyter kernels cannot be forked (ipykernel's threads and ZeroMQ sockets do not "
        "survive a fork); fork refuses them with a clear UsageError"
    ),
}
"""Conformance cases that do not hold on the ``jupyter`` backend, each with its reason (by
test name, or name with parameters). They are reported as skipped with the reason, never
silently; docs/jupyter.md lists the same differences."""


def _require(name: str, test: pytest.Item | None = None) -> str:
    if name == "jupyter" and test is not None:
        reason = JUPYTER_EXCEPTIONS.get(test.name) or JUPYTER_EXCEPTIONS.get(
            getattr(test, "originalname", "")
        )
        if reason is not None:
            pytest.skip(f"documented jupyter exception: {reason}")
    reason = _unavailable_reason(name)
    if reason is not None:
        if name in _names("SUNROOM_REQUIRE_BACKENDS", ""):
            pytest.fail(f"required backend {name!r} is unavailable: {reason}")
        pytest.skip(f"backend {name!r} unavailable here: {reason}")
    return name


@pytest.fixture(params=backends_under_test())
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend under test (kernel conformance)."""
    return _require(request.param, request.node)


@pytest.fixture(params=backends_under_test(ISOLATED_BACKENDS))
def isolated_backend(request: pytest.FixtureRequest) -> str:
    """The isolating backends under test (security suite)."""
    return _require(request.param)


@pytest.fixture(params=backends_under_test(THREAT_BACKENDS))
def threat_backend(request: pytest.FixtureRequest) -> str:
    """The isolating backends and the jupyter backend in bwrap (the core threat suite)."""
    return _require(request.param, request.node)


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
