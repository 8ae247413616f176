"""What a session hands its parts: :class:`SessionWiring`, the session's callbacks.

The kernel, the loop, the predictor, the submission and the host functions of a session are
given these callbacks rather than the session itself: :meth:`~SessionWiring.publish` (every
event field redacted, a branch's id added), :meth:`~SessionWiring.gate_for` (the approval gate
of a host function), the counts of embedding calls and network bytes against the budget (a
``BudgetWarning`` once spent) and the ``NetworkConnection`` events of the kernel's egress
proxy. One wiring belongs to one session and is built by it (:mod:`sunroom.agent.session`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, final

from sunroom.agent import events as ev
from sunroom.agent.approvals import Approvals
from sunroom.agent.budget import BudgetTracker
from sunroom.agent.bus import EventBus
from sunroom.agent.calls import Publish
from sunroom.agent.guard import Guard
from sunroom.errors import BudgetExceededError
from sunroom.sandbox.functions import Gate, HostFunction

if TYPE_CHECKING:
    from sunroom.network.proxy import Connection

__all__ = ["SessionWiring"]


@final
class SessionWiring:
    """The callbacks of one session, bound to its id, branch, guard, bus, budget and approvals.

    Args:
        session_id: the id the session's approval requests carry.
        branch: the branch id added to every event (None: not a branch).
        depth: the session's nesting depth (0: a root session).
        guard: redacts every event field and every text.
        bus: where events are published.
        tracker: the budget that embedding calls and network bytes count against.
        approvals: the broker that gates host functions.
        approval_publish: where approval requests are published (a nested session's go to
            its root's events, where they are answered); default: :meth:`publish`.
    """

    def __init__(
        self,
        *,
        session_id: str,
        branch: str | None,
        depth: int,
        guard: Guard,
        bus: EventBus,
        tracker: BudgetTracker,
        approvals: Approvals,
        approval_publish: Publish | None,
    ) -> None:
        self.session_id = session_id
        self.branch = branch
        self.depth = depth
        self.guard = guard
        self.bus = bus
        self.tracker = tracker
        self.approvals = approvals
        self.approval_publish: Publish = approval_publish or self.publish
        self._network_loop: asyncio.AbstractEventLoop | None = None

    def redact(self, text: str) -> str:
        """*text* with every secret replaced."""
        return self.guard.redact(text)

    def publish(self, cls: type[ev.Event], /, **fields: object) -> ev.Event:
        """Publish an event of type *cls*: every field redacted, the branch id added."""
        clean = {k: self.guard.redact_value(v) for k, v in fields.items()}
        if self.branch is not None:
            clean["branch"] = self.branch
        return self.bus.publish(cls, **clean)

    def gate_for(self, hf: HostFunction) -> Gate | None:
        """The approval gate of *hf* under the session's policies (None: no gate)."""
        return self.approvals.gate(
            hf,
            session_id=self.session_id,
            depth=self.depth,
            publish=self.approval_publish,
            redact=self.redact,
            redact_value=self.guard.redact_value,
        )

    def count_embedding(self, name: str) -> None:
        """Count one ``embed``/``search`` call against the budget (a BudgetWarning if spent)."""
        try:
            self.tracker.count_embedding_call()
        except BudgetExceededError as exc:
            self.publish(ev.BudgetWarning, limit=exc.limit, message=str(exc))
            raise

    def connection(self, c: Connection) -> None:
        """Publish one connection of the kernel's egress proxy (no header, no body)."""
        self.publish(
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

    def meter_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Publish network-budget warnings on *loop* (the session's own)."""
        self._network_loop = loop

    def charge_network(self, size: int) -> bool:
        """Count bytes through the proxy against the budget (a BudgetWarning once spent).

        Called on the egress thread or a relay thread (docs/network.md): the warning is
        published on the session's own loop (:meth:`meter_on`).
        """
        if self.tracker.charge_network(size):
            return True
        loop = self._network_loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the session's loop is closed: nobody to tell
                loop.call_soon_threadsafe(self._network_spent)
        return False

    def _network_spent(self) -> None:
        if self.tracker.exceeded is None:
            try:
                self.tracker.check()
            except BudgetExceededError as exc:
                self.publish(ev.BudgetWarning, limit=exc.limit, message=str(exc))
