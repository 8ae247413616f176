"""Shared fixtures: which backends the conformance suite runs on."""

from __future__ import annotations

import os

import pytest

IMPLEMENTED_BACKENDS = ("subprocess",)


def backends_under_test() -> list[str]:
    """Backends to run, from SUNROOM_TEST_BACKENDS (default: every implemented one)."""
    raw = os.environ.get("SUNROOM_TEST_BACKENDS", ",".join(IMPLEMENTED_BACKENDS))
    return [b.strip() for b in raw.split(",") if b.strip()]


@pytest.fixture(params=backends_under_test())
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name
