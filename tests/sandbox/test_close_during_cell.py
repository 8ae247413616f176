"""Closing a kernel while a cell runs (issue 26, item 3): the cell's caller gets ClosedError.

Before, the execute found the process gone after ``aclose()`` and failed an assertion.
"""

from __future__ import annotations

import asyncio

import pytest

from sunroom import AsyncKernel
from sunroom.errors import ClosedError


async def test_a_cell_cut_off_by_aclose_raises_closed_error() -> None:
    async with AsyncKernel(backend="subprocess") as kernel:
        cell = asyncio.ensure_future(kernel.execute("import time\ntime.sleep(60)", timeout_s=120))
        await asyncio.sleep(0.5)  # the cell is running
        await kernel.aclose()
        with pytest.raises(ClosedError, match="closed while the cell ran"):
            await asyncio.wait_for(cell, 10)
        assert not kernel.running
