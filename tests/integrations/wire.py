"""Counting what the host writes to a SunroomInterpreter's kernel, frame bytes on the wire.

Used by tests/integrations/test_dspy.py and loaded by path by benchmarks/integrations_dspy.py.
"""

from __future__ import annotations

from typing import Any

from sunroom.integrations.dspy import SunroomInterpreter


class WireCounter:
    """Starts *interpreter* and counts every byte the host writes to its kernel's RPC channel."""

    def __init__(self, interpreter: SunroomInterpreter) -> None:
        interpreter.start()
        kernel = interpreter.kernel
        assert kernel is not None
        channel = kernel.core._core.channel
        assert channel is not None
        transport = channel._transport
        assert transport is not None
        self.sent = 0
        write = transport.write

        def counting(data: Any) -> None:
            self.sent += memoryview(data).nbytes
            write(data)

        transport.write = counting  # type: ignore[method-assign]
