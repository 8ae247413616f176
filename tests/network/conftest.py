"""Proxy tests run once per way a client reaches the proxy and once per event loop.

``way_in``: the proxy's own Unix socket, or a TCP listener handed to it as a kernel's
supervisor does. The loops (``pytest_asyncio_loop_factories``): asyncio's own and uvloop, for
``test_proxy_*`` and ``test_handoff`` only (a kernel's host side runs on the caller's loop,
which may be either).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping

import pytest
import uvloop

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


_BOTH_LOOPS = ("test_proxy_", "test_handoff")


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The proxy's own tests run on asyncio's loop and on uvloop (whose transports differ)."""
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if not module.startswith(_BOTH_LOOPS):
        return {"asyncio": asyncio.new_event_loop}  # one factory: the test's id is unchanged
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
