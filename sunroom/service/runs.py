"""User messages into a live session, and the ends of its runs: :class:`SessionRuns`.

A message is recorded (``MessageReceived``, with a fresh id) once, then handed to the session,
which starts a run when it is idle or takes the message into the run that goes on. When a run
ends (its ``SessionEnded`` is durable) the session's record is set ``finished``, ``cancelled``
or ``failed``, unless something keeps it ``running``: a message being accepted
(``Live.sending``), another run already running, messages a resume sends next, or a message
the ending run never took in, which starts a run at once by :data:`LATE_NOTE`. The record's
status changes are ordered by ``Live.record_lock``, so a crash at any point leaves a record
that a restarted server resumes when, and only when, a run was left to finish.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sunroom.service.live import Live
from sunroom.service.recovery import MESSAGE_RECEIVED
from sunroom.service.signals import Signals
from sunroom.store import EventStore, SessionRecord, SessionStatus

__all__ = ["LATE_NOTE", "SessionRuns", "record_status"]

log = logging.getLogger("sunroom.service")

_STATUS: dict[str, SessionStatus] = {"success": "finished", "cancelled": "cancelled"}


def record_status(result: Mapping[str, object]) -> SessionStatus:
    """The record's status after a run that ended with *result*: finished, cancelled, failed."""
    return _STATUS.get(str(result.get("status")), "failed")


LATE_NOTE = (
    "[The service] The message(s) above arrived while your previous run was ending and were "
    "not answered by it; answer them now."
)
"""Starts the run that answers messages an ending run never took in (they precede it)."""


class SessionRuns:
    """Messages into live sessions and the ends of their runs (a base; not used alone).

    The part of :class:`~sunroom.service.sessions.SessionManager` described in this module.
    """

    store: EventStore
    owner: str
    signals: Signals
    _live: dict[str, Live]

    if TYPE_CHECKING:

        async def _record(self, sid: str) -> SessionRecord: ...

        async def _started(self, live: Live) -> None: ...

    async def _send(self, live: Live, text: str) -> None:
        """Accept a new user message: record it (with a fresh id) once, then deliver it.

        From its first look at the record until the session has the message, the message
        counts in ``live.sending``: a run that ends meanwhile (its ``SessionEnded`` may be
        written by this very append) leaves the record ``running``, for the run this message
        starts. Otherwise the record could say ``finished`` while that run goes on, and a crash
        during it would leave a run no restarted server resumes.
        """
        live.sending += 1
        live.touch()
        try:
            if live.preamble is not None and not live.session.running:
                sent, live.preamble = f"{live.preamble}\n\n{text}", None
            else:
                sent = text
            mid = uuid.uuid4().hex
            await self._reopen(live)
            await live.journal.append(MESSAGE_RECEIVED, {"id": mid, "text": text})
            await self._deliver(live, mid, sent, reopen=False)
        finally:
            live.sending -= 1
            live.touch()

    async def _deliver(
        self, live: Live, mid: str | None, text: str, *, reopen: bool = True
    ) -> None:
        """Hand message *mid* to the session as *text* (None: the restart note alone)."""
        live.sending += 1  # see _send: a run ending while this reopens leaves it running
        try:
            if reopen:
                await self._reopen(live)
            if mid is not None:
                live.journal.expect(mid, text)
            live.idle.clear()
            await self._started(live)
            await live.session.send(text)
        finally:
            live.sending -= 1

    async def _reopen(self, live: Live) -> None:
        async with live.record_lock:  # not while a run's end is being recorded
            record = await self._record(live.sid)
            if record.status != "running":
                await self.store.reopen_session(live.sid, owner=self.owner)

    async def _ended(self, live: Live, result: dict[str, object], *, more: bool = False) -> None:
        """A run of *live* ended with *result* (its ``SessionEnded`` is durable).

        A message accepted while the run was ending that it never took in is still queued in
        the session: a new run starts at once (by a note, not by sending the message again) and
        the record stays ``running``, so a crash now resumes and answers it. *more*: the caller
        sends messages next (a resume), so the record stays ``running`` too; so it does while
        a message is being accepted (``live.sending``: it starts the next run) or another run
        already runs (its own end records the session).
        """
        live.last_result = result
        live.touch()
        async with live.record_lock:  # a message's reopen sees the record before or after this
            late = (
                bool(live.journal.untaken)
                and result.get("status") != "cancelled"
                and not live.session.running
                and self._live.get(live.sid) is live
            )
            busy = live.sending > 0 or live.session.running
            if not (late or more or busy):
                status = record_status(result)
                try:
                    await self.store.finish_session(
                        live.sid, status=status, result=result, owner=self.owner
                    )
                except Exception:
                    # the record stays running; the run's end is in the log: a resume records it
                    log.exception("session %s: recording the end of its run failed", live.sid)
        if late:
            try:
                live.idle.clear()
                await live.session.send(LATE_NOTE)
            except Exception:
                log.exception("session %s: starting a run for a late message failed", live.sid)
        if not live.session.running or result.get("status") == "cancelled":
            live.idle.set()
        self.signals.fire(live.sid)
