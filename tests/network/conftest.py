"""The ``way_in`` fixture: run a proxy test once per way a client reaches the proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .upstream import WAY_IN


@pytest.fixture(params=["unix", "handoff"])
def way_in(request: pytest.FixtureRequest) -> Iterator[str]:
    """``unix`` (the proxy's own socket) or ``handoff`` (a TCP listener handed to it, as a kernel's)."""
    mode: str = request.param
    WAY_IN["mode"] = mode
    try:
        yield mode
    finally:
        WAY_IN["mode"] = "unix"
