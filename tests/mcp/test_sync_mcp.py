"""The sync twin binds MCP servers the same way."""

from __future__ import annotations

import sys

import pytest

import sunroom
from sunroom import Kernel
from tests.mcp.test_binding import SERVER

pytestmark = pytest.mark.usefixtures("no_process_left")


def test_the_sync_kernel_binds_servers() -> None:
    server = sunroom.mcp.stdio(sys.executable, [SERVER, "stdio"], name="tracker")
    with Kernel(backend="subprocess", mcp=[server]) as kernel:
        assert kernel.execute("tracker.add(20, 22)").value == "42"
        (copy,) = kernel.fork(1)  # a copy shares the connection
        assert copy.execute("tracker.add(1, 2)").value == "3"
        copy.close()
        assert kernel.execute("tracker.add(2, 2)").value == "4"
