"""What the service's parts report for its metrics: the :class:`Probe` seam.

The session manager, the kernel templates and the lease logic run without the web framework
(``sunroom run`` uses them), so they must not import ``prometheus_client``. They call a
:class:`Probe` instead: :data:`NO_PROBE` (which records nothing) unless the app hands them its
:class:`~sunroom.service.metrics.Metrics`. Every call is synchronous, cheap and never raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol, final

from sunroom.agent import events as ev
from sunroom.agent.budget import Spend

__all__ = ["NO_PROBE", "EventObserver", "NoProbe", "Probe"]

EventObserver = Callable[[ev.Event], None]
"""Told every event one session publishes, in order (by its journal)."""


class Probe(Protocol):
    """Receives what the service's inner parts observe (see the module docstring)."""

    def session_observer(
        self, journal: object, *, backend: str, model: str, spent: Spend | None
    ) -> EventObserver:
        """The observer of one session's events.

        *journal* identifies the session while it lives (held by a weak reference, so it
        must allow one; its kernel is counted under *backend* while the manager holds the
        session); *model* is its ``provider:name`` spec; *spent*
        is what its log already counted (a resumed session), so totals count from there.
        """
        ...

    def pool_claimed(self, pool: str, *, hit: bool, seconds: float) -> None:
        """A kernel was claimed from warm pool *pool* in *seconds*.

        *hit*: the pool had one ready (a template's pool is ``template:NAME``, and a hit means
        the template was started already).
        """
        ...

    def lease_handover(self) -> None:
        """Count a session this process took over from another owner."""
        ...


@final
class NoProbe:
    """The :class:`Probe` that records nothing (outside the HTTP app)."""

    def session_observer(
        self, journal: object, *, backend: str, model: str, spent: Spend | None
    ) -> EventObserver:
        """An observer that ignores every event."""
        return _ignore

    def pool_claimed(self, pool: str, *, hit: bool, seconds: float) -> None:
        """Nothing."""

    def lease_handover(self) -> None:
        """Nothing."""


def _ignore(event: ev.Event) -> None:
    return None


NO_PROBE: Final[Probe] = NoProbe()
"""The probe of parts the app did not give one."""
