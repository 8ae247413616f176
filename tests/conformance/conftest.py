"""Fixtures of the fork and template conformance cases."""

from __future__ import annotations

import pytest

from tests.conftest import _require, backends_under_test

FORK_BACKENDS = backends_under_test(("subprocess", "bwrap", "docker"))


@pytest.fixture(params=FORK_BACKENDS)
def fork_backend(request: pytest.FixtureRequest) -> str:
    """The backends whose kernels fork (checked before any loop runs)."""
    return _require(request.param)
