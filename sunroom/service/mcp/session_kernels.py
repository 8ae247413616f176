"""What ``sunroom mcp`` keeps: its settings, and one kernel per MCP session.

:class:`McpSettings` says how kernels and tools run; :class:`SessionKernels` starts each MCP
session's kernel at its first use and closes it with the session.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final, final

from mcp.server.connection import Connection

from sunroom.errors import ClosedError, UsageError
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.backends import DEFAULT_BACKEND
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits

__all__ = ["MAX_TIMEOUT_S", "McpSettings", "SessionKernels", "Slot"]

MAX_TIMEOUT_S: Final = 3600.0
"""The largest ``timeout_s`` any setting may allow ``execute_code``."""

_SLOT_KEY: Final = "sunroom.kernel"


@final
@dataclass(frozen=True, kw_only=True, slots=True)
class McpSettings:
    """How ``sunroom mcp`` runs its kernels and tools.

    Attributes:
        backend: the kernel backend (``bwrap`` by default; never a silent fallback), a name
            or a Backend (``sunroom mcp --backend jupyter --kernel-name K`` passes a
            :class:`~sunroom.JupyterBackend`).
        limits: every kernel's limits; ``limits.timeout_s`` is ``execute_code``'s default.
        max_timeout_s: the largest ``timeout_s`` a call may ask for (at most
            :data:`MAX_TIMEOUT_S`).
        max_file_bytes: the largest file ``read_file`` returns and ``write_file`` writes.
        models: models ``run_agent`` may use (``provider:name``); the first is the default.
            Empty: no ``run_agent`` tool.
        base_url: the endpoint of those models (``openai-compatible:``), if any.
        max_turns: model turns of one ``run_agent`` run.
        max_sessions: MCP sessions open at once over HTTP (one more is answered 503).
        session_idle_s: an HTTP session idle this long is ended, and its kernel closed.
    """

    backend: str | Backend = DEFAULT_BACKEND
    limits: Limits = field(default_factory=Limits)
    max_timeout_s: float = 600.0
    max_file_bytes: int = 8 * 1024 * 1024
    models: tuple[str, ...] = ()
    base_url: str | None = None
    max_turns: int = 20
    max_sessions: int = 16
    session_idle_s: float = 1800.0

    def __post_init__(self) -> None:
        if not 0 < self.max_timeout_s <= MAX_TIMEOUT_S:
            raise UsageError(
                f"the largest cell timeout must be in (0, {MAX_TIMEOUT_S:g}] s, "
                f"got {self.max_timeout_s:g}"
            )
        if self.limits.timeout_s > self.max_timeout_s:
            raise UsageError(
                f"the default cell timeout ({self.limits.timeout_s:g} s) is over the largest "
                f"one allowed ({self.max_timeout_s:g} s)"
            )
        if self.max_file_bytes <= 0:
            raise UsageError(f"the file size cap must be positive, got {self.max_file_bytes}")
        if self.max_turns <= 0:
            raise UsageError(f"max_turns must be positive, got {self.max_turns}")
        if self.max_sessions <= 0:
            raise UsageError(f"max_sessions must be positive, got {self.max_sessions}")
        if not 0 < self.session_idle_s < float("inf"):
            raise UsageError(f"the session idle time must be positive, got {self.session_idle_s:g}")


# -- the per-session kernels --------------------------------------------------------------------


@final
class Slot:
    """The kernel of one MCP session: started at its first use, closed with the session."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.kernel: AsyncKernel | None = None
        self.closed = False


@final
class SessionKernels:
    """The kernels of the open MCP sessions (the server's lifespan state).

    Every session gets a :class:`Slot`; :meth:`aclose` (the server stopping) closes every
    kernel still open.
    """

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings
        self._slots: set[Slot] = set()
        self._stdio_slot: Slot | None = None

    def slot(self, connection: Connection | None) -> Slot:
        """The slot of *connection*'s session (None: the one stdio client), made at first use."""
        if connection is None:
            if self._stdio_slot is None:
                self._stdio_slot = self._new()
            return self._stdio_slot
        slot = connection.state.get(_SLOT_KEY)
        if not isinstance(slot, Slot):
            slot = self._new()
            connection.state[_SLOT_KEY] = slot
            connection.exit_stack.push_async_callback(self.release, slot)
        return slot

    def _new(self) -> Slot:
        slot = Slot()
        self._slots.add(slot)
        return slot

    async def kernel(self, slot: Slot) -> AsyncKernel:
        """The slot's kernel, started now if it has none. Raises ClosedError, KernelError."""
        async with slot.lock:
            if slot.closed:
                raise ClosedError("the MCP session has ended")
            if slot.kernel is None:
                kernel = AsyncKernel(backend=self.settings.backend, limits=self.settings.limits)
                await kernel.start()
                slot.kernel = kernel
            return slot.kernel

    async def reset(self, slot: Slot) -> bool:
        """Close the slot's kernel (the next use starts a fresh one); whether there was one."""
        async with slot.lock:
            kernel, slot.kernel = slot.kernel, None
        if kernel is None:
            return False
        await kernel.aclose()
        return True

    async def release(self, slot: Slot) -> None:
        """Close the slot's kernel for good: its session ended.

        The slot is forgotten only once its kernel is closed: if this is cancelled (the SDK
        bounds a session's cleanup), :meth:`aclose` closes the kernel again at the server's stop.
        """
        slot.closed = True
        if slot.kernel is not None:
            await slot.kernel.aclose()
        slot.kernel = None
        self._slots.discard(slot)

    async def aclose(self) -> None:
        """Close every kernel still open; every one is tried, the first failure is raised."""
        slots, self._slots = list(self._slots), set()
        results = await asyncio.gather(*(self.release(s) for s in slots), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
