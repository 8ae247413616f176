"""Taking a session over from the store and running it here: :class:`SessionResume`.

A session another process left ``running`` (it crashed, or stopped) is resumed here: claim it
(of several processes racing, exactly one wins; a live owner's lease answers 503 with
Retry-After), fold its log (:func:`~sunroom.service.recovery.replay`), let
:func:`~sunroom.service.recovery.plan` decide what the resumed session does, and carry that
out: mark the host calls left without an outcome ``unknown`` (never replayed), deny the
approval requests that waited, start a fresh kernel and publish ``KernelRestarted``, record a
run's end the log lacks, then send the messages no run answered. No cell is re-run.

A session this process released while idle (:mod:`sunroom.service.idle`) comes back the same
way on its next message: the same pass, the same ``KernelRestarted`` with ``state_lost``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from sunroom.agent.budget import Spend
from sunroom.providers import Message
from sunroom.service.build import SessionBuilder
from sunroom.service.config import ServiceConfig
from sunroom.service.live import Live
from sunroom.service.probes import Probe
from sunroom.service.problems import OwnedElsewhereError
from sunroom.service.recovery import (
    CALL_OUTCOME_UNKNOWN,
    RESTART_DENIAL,
    plan,
    replay,
    unreported_unknown,
    untold_unknown,
)
from sunroom.service.runs import SessionRuns
from sunroom.service.schemas import CreateSession
from sunroom.store import SessionRecord, StoredEvent

__all__ = ["SessionResume"]

log = logging.getLogger("sunroom.service")


class SessionResume(SessionRuns):
    """Resuming sessions from the store (a base of the manager; not used alone).

    The part of :class:`~sunroom.service.sessions.SessionManager` described in this module.
    """

    config: ServiceConfig
    probe: Probe
    _builder: SessionBuilder

    if TYPE_CHECKING:

        def _slot(self) -> contextlib.AbstractAsyncContextManager[None]: ...

        def _one_resume(self, sid: str) -> contextlib.AbstractAsyncContextManager[None]: ...

        async def _released_here(self, sid: str) -> None: ...

        def _unhold(self, live: Live) -> None: ...

        async def _start(self, live: Live) -> None: ...

    async def resume(self, sid: str) -> Live:
        """Take over session *sid* from the store and run it here (see the module docstring).

        Raises NotFoundError, OwnedElsewhereError (another live server holds its lease: a 503
        with Retry-After), CapacityError.
        """
        live = await self._resume_held(sid)
        self._unhold(live)
        return live

    async def _resume_held(self, sid: str) -> Live:
        """:meth:`resume`, the session returned held (``Live.holds``): the caller unholds it.

        Resumes of one session run one at a time; a release of it in progress is waited for
        (its last events are in the log before the log is read).
        """
        async with self._one_resume(sid):
            await self._released_here(sid)
            if (live := self._live.get(sid)) is not None:
                live.holds += 1
                return live
            async with self._slot():
                record = await self._record(sid)
                if not await self.store.claim(sid, owner=self.owner, lease_s=self.config.lease_s):
                    left = (record.lease_expires_at or time.time()) - time.time()
                    raise OwnedElsewhereError(
                        f"session {sid} is run by another live server; retry after its lease "
                        "runs out (Retry-After)",
                        retry_after_s=max(left, 0.0) + 0.5,
                    )
                try:
                    live = await self._take_over(await self._record(sid))  # its new generation
                    if record.status == "running" and record.owner != self.owner:
                        self.probe.lease_handover()  # left running by another process
                    return live
                except BaseException:
                    try:
                        await self.store.release(sid, owner=self.owner)
                    except Exception:
                        log.exception("session %s: releasing it after a failed resume failed", sid)
                    raise

    async def _take_over(self, record: SessionRecord) -> Live:
        """Resume *record* in one pass: fold the log, let :func:`plan` decide, carry it out.

        Nothing here decides what is pending: :func:`replay` folds the log into one state and
        :func:`plan` alone says what the resumed session does.
        """
        sid = record.session_id
        request = CreateSession.model_validate(record.config)
        state = replay(await self._all_events(sid))
        calls = await self.store.calls(sid)
        unknown = unreported_unknown(state, calls)
        for c in unknown:
            if c.outcome is None:
                await self.store.mark_unknown(
                    sid, c.call_id, owner=self.owner, generation=record.generation
                )
        todo = plan(
            state,
            unknown=untold_unknown(state, calls),
            was_running=record.status == "running",
            session_id=sid,
        )
        live = await self._open(
            sid,
            request,
            next_seq=state.last_seq + 1,
            first_call=len(calls) + 1,
            transcript=todo.transcript or None,
            spent=state.spent,
            generation=record.generation,
        )
        for c in unknown:
            await live.journal.append(
                CALL_OUTCOME_UNKNOWN,
                {"call_id": c.call_id, "name": c.name, "args": c.args,
                 "idempotency_key": c.idempotency_key},
            )  # fmt: skip
        for a in state.waiting_approvals:  # the call never ran: deny it, durably and visibly
            await live.journal.append(
                "ApprovalAnswered",
                {"call_id": a["call_id"], "name": a["name"], "allow": False,
                 "reason": RESTART_DENIAL, "lease": False, "by": "closed",
                 **({"branch": a["branch"]} if "branch" in a else {})},
            )  # fmt: skip
        await live.journal.append(
            "KernelRestarted",
            {"reason": "the session was resumed from its log with a new kernel (the service "
                       "restarted, or the session was idle and gave its kernel back); cells "
                       "were not re-run",
             "state_lost": True, "unknown_calls": [c.call_id for c in unknown],
             "denied_approvals": [a["call_id"] for a in state.waiting_approvals]},
        )  # fmt: skip
        log.info("session %s resumed (%d unknown calls)", sid, len(unknown))
        if todo.end_with is not None:
            if state.run_open:  # the log has no SessionEnded for it: write one
                await live.journal.append("SessionEnded", {"result": todo.end_with})
            await self._ended(live, todo.end_with, more=bool(todo.sends))
        live.preamble = todo.preamble
        for mid, text in todo.sends:
            await self._deliver(live, mid, text)
        return live

    async def _all_events(self, sid: str) -> list[StoredEvent]:
        out: list[StoredEvent] = []
        while batch := await self.store.events(
            sid, after_seq=out[-1].seq if out else 0, limit=1000
        ):
            out.extend(batch)
        return out

    async def _open(
        self,
        sid: str,
        request: CreateSession,
        *,
        next_seq: int,
        first_call: int,
        transcript: list[Message] | None,
        spent: Spend | None = None,
        generation: int | None = None,
    ) -> Live:
        """Build and start session *sid* (see :meth:`SessionBuilder.build` and :meth:`_start`)."""
        live = await self._builder.build(
            sid,
            request,
            next_seq=next_seq,
            first_call=first_call,
            transcript=transcript,
            spent=spent,
            generation=generation,
        )
        await self._start(live)
        return live
