"""The idle policy: which live sessions may give their kernel and their slot back, and when.

A session is live here while it holds a kernel (and a ``max_sessions`` slot). Once it is
*idle* (:func:`is_idle`: no run in progress, no message being accepted, no approval waiting, no
run's end being recorded, nothing holding it such as an SSE reader or its own creation or
resume), it is released: its kernel is stopped (its processes gone), its journal flushed, its
model closed and its lease given up, and it leaves the slot. That happens

* after ``ServiceConfig.session_idle_s`` of idleness (:func:`release_idle_forever` looks every
  quarter of it, at most every 30 s), and
* at once, least recently used first (:func:`least_recently_used`), when a session being
  created or resumed would otherwise be refused for ``max_sessions``.

A released session stays in the store. Its next message resumes it from its log exactly as
after a crash (:meth:`~sunroom.service.resume.SessionResume.resume`): a fresh kernel,
``KernelRestarted`` with ``state_lost``, the transcript rebuilt, the model told. A session that
is running a turn, waiting on an approval or being streamed is never released.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Protocol

from sunroom.service.config import ServiceConfig
from sunroom.service.live import Live

__all__ = ["Releaser", "is_idle", "least_recently_used", "release_idle_forever", "sweep_interval"]

log = logging.getLogger("sunroom.service")


class Releaser(Protocol):
    """What :func:`release_idle_forever` uses of the session manager (which implements it)."""

    @property
    def config(self) -> ServiceConfig:
        """The service's configuration (``session_idle_s``)."""
        ...

    def live_sessions(self) -> list[Live]:
        """The sessions this process runs now."""
        ...

    async def release(self, sid: str) -> bool:
        """Release session *sid* if it is live here and idle; whether it was."""
        ...


def is_idle(live: Live) -> bool:
    """Whether *live* may be released now (see the module docstring).

    Only reads flags and counters: safe to call from the health gate's thread.
    """
    return (
        live.idle.is_set()
        and live.sending == 0
        and live.holds == 0
        and not live.record_lock.locked()
        and not live.session.running
        and not live.session.pending_approvals()
    )


def least_recently_used(lives: Iterable[Live]) -> Live | None:
    """The idle session of *lives* used longest ago, or None when none is idle."""
    idle = [live for live in lives if is_idle(live)]
    return min(idle, key=lambda live: live.last_used, default=None)


def sweep_interval(idle_s: float) -> float:
    """How often :func:`release_idle_forever` looks: a quarter of *idle_s*, 0.05 to 30 s."""
    return min(30.0, max(0.05, idle_s / 4))


async def release_idle_forever(manager: Releaser) -> None:
    """Release every session idle for ``session_idle_s`` or more, until cancelled."""
    idle_s = manager.config.session_idle_s
    while True:
        await asyncio.sleep(sweep_interval(idle_s))
        now = time.monotonic()
        for live in manager.live_sessions():
            if is_idle(live) and now - live.last_used >= idle_s:
                try:
                    await manager.release(live.sid)
                except Exception:
                    log.exception("session %s: releasing it while idle failed", live.sid)
