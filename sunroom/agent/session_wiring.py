"""What a session hands its parts: event publishing, approval gates, budget charges, the shim.

:class:`SessionWiring` holds the callbacks :meth:`AsyncSession._setup
<sunroom.agent.session_setup.SessionSetup._setup>` gives the kernel, the loop, the predictor and
the host functions: :meth:`_publish` (every event field redacted, a branch's id added),
:meth:`_gate_for` (the approval gate of a host function), the counts of embedding calls and
network bytes against the budget (a ``BudgetWarning`` once spent), the ``NetworkConnection``
events of the kernel's egress proxy, and the installation of the kernel-side helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from sunroom.agent import events as ev
from sunroom.agent.approvals import Approvals
from sunroom.agent.budget import BudgetTracker
from sunroom.agent.bus import EventBus
from sunroom.agent.calls import Publish
from sunroom.agent.guard import Guard
from sunroom.agent.shim import SHIM_SOURCE
from sunroom.errors import BudgetExceededError, KernelError
from sunroom.sandbox.functions import Gate, HostFunction
from sunroom.sandbox.kernel import AsyncKernel

if TYPE_CHECKING:
    from sunroom.network.proxy import Connection


class SessionWiring:
    """The callbacks a session's parts are given; the attributes they read (set by ``_setup``)."""

    session_id: str
    branch: str | None
    tracker: BudgetTracker
    _guard: Guard
    _bus: EventBus
    _approvals: Approvals
    _approval_publish: Publish
    _depth: int
    _kernel: AsyncKernel
    _network_loop: asyncio.AbstractEventLoop

    def _redact(self, text: str) -> str:
        return self._guard.redact(text)

    def _count_embedding(self, name: str) -> None:
        """Count one ``embed``/``search`` call against the budget (a BudgetWarning if spent)."""
        try:
            self.tracker.count_embedding_call()
        except BudgetExceededError as exc:
            self._publish(ev.BudgetWarning, limit=exc.limit, message=str(exc))
            raise

    def _connection(self, c: Connection) -> None:
        """Publish one connection of the kernel's egress proxy (no header, no body)."""
        self._publish(
            ev.NetworkConnection,
            host=c.host,
            port=c.port,
            scheme=c.scheme,
            allowed=c.allowed,
            reason=c.reason,
            bytes_sent=c.bytes_sent,
            bytes_received=c.bytes_received,
            duration_s=c.duration_s,
        )

    def _charge_network(self, size: int) -> bool:
        """Count bytes through the proxy against the budget (a BudgetWarning once spent).

        Called on the egress thread or a relay thread (docs/network.md): the warning is
        published on the session's own loop (:attr:`_network_loop`).
        """
        if self.tracker.charge_network(size):
            return True
        with contextlib.suppress(RuntimeError):  # the session's loop is closed: nobody to tell
            self._network_loop.call_soon_threadsafe(self._network_spent)
        return False

    def _network_spent(self) -> None:
        if self.tracker.exceeded is None:
            try:
                self.tracker.check()
            except BudgetExceededError as exc:
                self._publish(ev.BudgetWarning, limit=exc.limit, message=str(exc))

    def _gate_for(self, hf: HostFunction) -> Gate | None:
        return self._approvals.gate(
            hf,
            session_id=self.session_id,
            depth=self._depth,
            publish=self._approval_publish,
            redact=self._redact,
            redact_value=self._guard.redact_value,
        )

    def _publish(self, cls: type[ev.Event], /, **fields: Any) -> ev.Event:
        clean = {k: self._guard.redact_value(v) for k, v in fields.items()}
        if self.branch is not None:
            clean["branch"] = self.branch
        return self._bus.publish(cls, **clean)

    async def _install_shim(self) -> None:
        result = await self._kernel.execute(SHIM_SOURCE)
        if not result.ok:
            message = result.error.message if result.error else result.status
            raise KernelError(f"installing predict/submit in the kernel failed: {message}")
