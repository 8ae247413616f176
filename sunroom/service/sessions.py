"""Agent sessions run by the service: :class:`SessionManager`.

The manager runs :class:`~sunroom.agent.AsyncSession` objects whose every event goes to the
store before any client sees it (:class:`~sunroom.service.journal.Journal`), records host
calls before they run (:class:`~sunroom.service.journal.CallLedger`), owns each session by a
renewed lease, and resumes sessions a dead process left ``running``: claim (exactly one process
wins), rebuild the transcript from the log, start a fresh kernel, publish ``KernelRestarted``,
mark unfinished calls ``unknown`` (never replayed) and carry on with the run. No cell is re-run.
With a file store its owner string is stable across restarts
(:func:`~sunroom.service.live.stable_owner`): a restarted server reclaims its own sessions at
once instead of waiting out their leases (and answering 409 meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, final

from sunroom.agent.budget import Spend
from sunroom.agent.hooks import Hooks, Veto
from sunroom.agent.session import AsyncSession
from sunroom.errors import ApprovalNotPending, UsageError
from sunroom.kernel_choice import JUPYTER, describe_backend
from sunroom.providers import Message, Model
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.inputs import File
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.service import leases
from sunroom.service.codec import jsonable
from sunroom.service.config import ServiceConfig
from sunroom.service.journal import CallLedger, Journal
from sunroom.service.live import Identity, Live, ModelResolver, new_owner, stable_owner
from sunroom.service.problems import (
    CapacityError,
    ConflictError,
    NotFoundError,
    OwnedElsewhereError,
)
from sunroom.service.recovery import (
    CALL_OUTCOME_UNKNOWN,
    MESSAGE_RECEIVED,
    RESTART_DENIAL,
    plan,
    replay,
    unreported_unknown,
    untold_unknown,
)
from sunroom.service.schemas import CreateSession, FileInputIn, network_spec, output_type
from sunroom.service.signals import Signals
from sunroom.service.templates import Templates
from sunroom.store import EventStore, SessionRecord, SessionStatus, SQLiteStore, StoredEvent

__all__ = ["ModelResolver", "SessionManager", "new_owner"]

log = logging.getLogger("sunroom.service")

_STATUS: dict[str, SessionStatus] = {"success": "finished", "cancelled": "cancelled"}

LATE_NOTE = (
    "[The service] The message(s) above arrived while your previous run was ending and were "
    "not answered by it; answer them now."
)
"""Starts the run that answers messages an ending run never took in (they precede it)."""


@final
class SessionManager:
    """Runs, persists and resumes sessions for one service process.

    Args:
        store: an open store (the caller closes it after :meth:`aclose`).
        config: limits, defaults, lease length.
        resolve_model: builds a model from a session's ``model``/``base_url``.
        functions: host functions offered to every session (their calls are recorded).
        owner: this process's owner string (default: :func:`new_owner`).
    """

    def __init__(
        self,
        store: EventStore,
        *,
        config: ServiceConfig,
        resolve_model: ModelResolver,
        functions: Sequence[HostFunction] = (),
        owner: str | None = None,
        templates: Templates | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self._templates = templates or Templates(config)
        self._identity: Identity | None = None
        if owner is None and isinstance(store, SQLiteStore) and str(store.path) != ":memory:":
            self._identity = stable_owner(store.path)
        self.owner = owner or (self._identity.owner if self._identity else new_owner())
        self.signals = Signals()
        self._resolve = resolve_model
        self._functions = tuple(functions)
        self._live: dict[str, Live] = {}
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start lease renewal and, when configured, resuming its own and orphaned sessions."""
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(leases.renew_forever(self), name="sunroom-renew"))
        if self.config.resume_orphans:  # a server, not `sunroom sessions resume ID`
            task = loop.create_task(leases.reclaim_own(self), name="sunroom-reclaim")
            self._tasks.append(task)
            task = loop.create_task(leases.resume_forever(self), name="sunroom-orphans")
            self._tasks.append(task)

    async def aclose(self) -> None:
        """Stop every live session and the background tasks.

        A stopped session's record stays ``running``: another process (or this one, started
        again) resumes it once the lease runs out.
        """
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)  # our own cancellation still propagates
        for task in self._tasks:
            if not task.cancelled() and task.exception() is not None:
                log.error("%s failed", task.get_name(), exc_info=task.exception())
        if self._closing:
            await asyncio.wait(self._closing)  # sessions dropped earlier finish closing
        for live in list(self._live.values()):
            await self._shutdown(live, finish=False)
        if self._identity is not None:
            self._identity.release()

    @property
    def live(self) -> int:
        """Sessions this process runs now."""
        return len(self._live)

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    def live_ids(self) -> list[str]:
        """Ids of the sessions this process runs now."""
        return list(self._live)

    def is_live(self, sid: str) -> bool:
        """Whether this process runs session *sid*."""
        return sid in self._live

    # -- the API ---------------------------------------------------------------------------

    async def create(self, request: CreateSession, *, session_id: str | None = None) -> str:
        """Start a new session (and its first run when the request has a task); its id.

        Everything a request can get wrong (no model, an unknown provider or backend, a missing
        API key, bad limits, budget or schema) is checked before the session is recorded, so a
        refused request leaves nothing in the store. *session_id* is the id to use (default: a
        fresh one); a caller that may be interrupted picks it first, to know what to resume.

        Raises CapacityError, UsageError (bad options, no model), AuthenticationError (no API
        key), KernelStartError / SandboxUnavailableError (the kernel did not start; the
        session is recorded ``failed``, or ``cancelled`` when the start was cancelled).
        """
        if request.model is None:
            request = request.model_copy(update={"model": self.config.model})
        if request.model is None:
            raise UsageError("no model: name one in the request or start the server with one")
        if request.base_url is not None and not self.config.base_url_allowed(request.base_url):
            raise UsageError(
                "base_url is not one this server allows: its API keys go only to the base URLs "
                "it was started with (SUNROOM_BASE_URL, SUNROOM_ALLOWED_BASE_URLS)"
            )
        if request.base_url is None and self.config.base_url is not None:
            request = request.model_copy(update={"base_url": self.config.base_url})
        request = pin_files(request)
        jupyter = (request.backend or self.config.backend) == JUPYTER
        if jupyter and request.template is None:  # recorded as it runs: kernel and sandbox
            chosen = self.config.kernel_backend(
                request.backend, kernel_name=request.kernel_name, sandbox=request.sandbox
            )
            request = request.model_copy(update=describe_backend(chosen))
        sid = session_id or uuid.uuid4().hex
        async with self._lock:
            self._check_capacity()
            live = await self._build(sid, request, next_seq=1, first_call=1, transcript=None)
            try:
                await self.store.create_session(
                    sid,
                    config=request.model_dump(mode="json"),
                    owner=self.owner,
                    lease_s=self.config.lease_s,
                )
            except BaseException:
                await self._discard(live)
                raise
            try:
                await self._start(live)
            except BaseException as exc:
                await self._record_failed(sid, exc)
                raise
        if request.task is not None:
            await self._send(live, request.task)
        return sid

    async def _record_failed(self, sid: str, exc: BaseException) -> None:
        """Record a session whose kernel did not start (``failed``, ``cancelled``); let it go."""
        if isinstance(exc, asyncio.CancelledError):
            status: SessionStatus = "cancelled"
            result = {"error": "cancelled while its kernel started"}
        else:
            status, result = "failed", {"error": str(exc)}
        try:
            await self.store.finish_session(sid, status=status, result=result, owner=self.owner)
            await self.store.release(sid, owner=self.owner)
        except Exception:
            log.exception("session %s: recording that it failed to start failed", sid)

    async def send(self, sid: str, text: str) -> None:
        """Send a user message; it starts a run when the session is idle.

        A session known to the store but not live here is resumed first. Raises
        NotFoundError, OwnedElsewhereError (another live server holds it: 503, Retry-After).
        """
        live = self._live.get(sid) or await self.resume(sid)
        await self._send(live, text)

    async def result(self, sid: str, *, timeout_s: float) -> tuple[SessionStatus, Any]:
        """Wait up to *timeout_s* for the session's run to end: (status, result JSON).

        Returns ``("running", None)`` when it has not ended in time. Raises NotFoundError.
        """
        live = self._live.get(sid)
        if live is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.idle.wait(), timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            record = await self._record(sid)
            if record.status != "running" or loop.time() >= deadline:
                return record.status, record.result
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))

    async def delete(self, sid: str) -> None:
        """Stop the session: cancel its run, kill its kernel, record it ``cancelled``.

        Raises NotFoundError. A session another process runs is only marked cancelled.
        """
        live = self._live.get(sid)
        if live is not None:
            await self._shutdown(live, finish=True)
            return
        record = await self._record(sid)
        if record.status == "running":
            await self.store.finish_session(
                sid, status="cancelled", result={"error": "deleted"}, owner=None
            )
        self.signals.fire(sid)

    async def kernel(self, sid: str) -> AsyncKernel:
        """The kernel of session *sid*, which this process runs (for its files).

        Raises NotFoundError (no such session), ConflictError (the session is not running in
        this process: ended, or another server runs it).
        """
        live = self._live.get(sid)
        if live is None:
            await self._record(sid)  # NotFoundError
            raise ConflictError("the session's kernel is not running in this server")
        kernel: AsyncKernel = live.session._kernel  # noqa: SLF001 - the service's own session
        return kernel

    async def approvals(self, sid: str) -> list[dict[str, Any]]:
        """The approval requests of session *sid* that wait for an answer, oldest first.

        Raises NotFoundError, ConflictError (the session runs, but in another server).
        """
        live = self._live.get(sid)
        if live is None:
            record = await self._record(sid)
            if record.status == "running":
                raise ConflictError("the session is not running in this server")
            return []
        return [
            {
                "call_id": r.call_id,
                "name": r.name,
                "arguments": jsonable(r.arguments),
                "depth": r.depth,
                "requested_at": r.requested_at,
                "expires_at": r.requested_at + r.timeout_s,
            }
            for r in live.session.pending_approvals()
        ]

    async def approve(
        self, sid: str, call_id: str, *, allow: bool, reason: str | None, lease: bool
    ) -> None:
        """Answer approval request *call_id* of session *sid*; the answer is durable on return.

        Raises NotFoundError (no such session or request), ConflictError (already answered,
        or the session is not running in this server).
        """
        live = self._live.get(sid)
        if live is None:
            await self._record(sid)
            raise ConflictError("the session is not running in this server")
        try:
            await live.session.approve(call_id, allow=allow, reason=reason, lease=lease)
        except ApprovalNotPending as exc:
            if exc.answered:
                raise ConflictError("that approval request was already answered") from None
            raise NotFoundError("the session has no approval request with that id") from None
        await live.journal.flush()

    async def get(self, sid: str) -> SessionRecord:
        """The session's record. Raises NotFoundError."""
        return await self._record(sid)

    # -- resume ----------------------------------------------------------------------------

    async def resume(self, sid: str) -> Live:
        """Take over session *sid* from the store and run it here (see the module docstring).

        Raises NotFoundError, OwnedElsewhereError (another live server holds its lease: a 503
        with Retry-After), CapacityError.
        """
        async with self._lock:
            if sid in self._live:
                return self._live[sid]
            self._check_capacity()
            record = await self._record(sid)
            if not await self.store.claim(sid, owner=self.owner, lease_s=self.config.lease_s):
                left = (record.lease_expires_at or time.time()) - time.time()
                raise OwnedElsewhereError(
                    f"session {sid} is run by another live server; retry after its lease "
                    "runs out (Retry-After)",
                    retry_after_s=max(left, 0.0) + 0.5,
                )
            try:
                return await self._take_over(record)
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
                await self.store.mark_unknown(sid, c.call_id, owner=self.owner)
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
            {"reason": "the session was resumed in a new service process; cells were not re-run",
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

    async def resume_orphans(self) -> list[str]:
        """Resume every session whose owner's lease ran out; the ids this process took."""
        return await leases.resume_orphans(self)

    # -- internals -------------------------------------------------------------------------

    def _check_capacity(self) -> None:
        if len(self._live) >= self.config.max_sessions:
            raise CapacityError(
                f"this server runs its limit of {self.config.max_sessions} sessions"
            )

    async def _record(self, sid: str) -> SessionRecord:
        record = await self.store.get_session(sid)
        if record is None:
            raise NotFoundError(f"no session {sid!r}")
        return record

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
    ) -> Live:
        """Build and start session *sid* (see :meth:`_build` and :meth:`_start`)."""
        live = await self._build(
            sid,
            request,
            next_seq=next_seq,
            first_call=first_call,
            transcript=transcript,
            spent=spent,
        )
        await self._start(live)
        return live

    async def _build(
        self,
        sid: str,
        request: CreateSession,
        *,
        next_seq: int,
        first_call: int,
        transcript: list[Message] | None,
        spent: Spend | None = None,
    ) -> Live:
        """The session *sid* asks for, not started: touches neither the store nor a kernel.

        Raises UsageError (unknown provider or backend, bad limits, budget or schema) and
        AuthenticationError (no API key), after which nothing is left to close.
        """
        assert request.model is not None
        backend = self.config.kernel_backend(
            request.backend, kernel_name=request.kernel_name, sandbox=request.sandbox
        )
        limits = request.limits.build() if request.limits else None
        network = self.config.network(network_spec(request.network))
        template = None
        if request.template is not None:
            if limits is not None:
                raise UsageError("a session from a template runs with its limits; omit limits")
            if request.kernel_name is not None or request.sandbox is not None:
                raise UsageError(
                    "a session from a template runs on its backend; omit kernel_name and sandbox"
                )
            template = await self._templates.get(request.template)
        budget = request.budget.build() if request.budget else None
        output = output_type(request.output_schema)
        holder: list[Live] = []
        journal = Journal(
            self.store,
            sid,
            owner=self.owner,
            next_seq=next_seq,
            notify=lambda: self.signals.fire(sid),
            on_ended=lambda result: self._ended(holder[0], result),
            on_failed=lambda exc: self.drop(sid, exc),
        )

        async def checkpoint(code: str) -> Veto | None:
            await journal.flush()  # the reply asking for this cell is durable before it runs
            return None

        ledger = CallLedger(self.store, sid, owner=self.owner, first_call=first_call)
        servers = self.config.mcp(request.mcp)
        toolset = None
        if servers:
            from sunroom.mcp.toolset import Toolset

            toolset = Toolset(servers, wrap=ledger.wrap)  # MCP calls are recorded like any
        model = self._resolve(request.model, request.base_url)
        try:
            session = AsyncSession(
                model=model,
                preset=request.preset,
                backend=backend,
                limits=limits,
                functions=[ledger.wrap(f) for f in self._functions],
                inputs={**request.inputs, **bound_files(request.files)} or None,
                output=output,
                budget=budget,
                max_turns=request.max_turns,
                system_prompt=request.system_prompt,
                code_tool=request.code_mode == "tool",
                hooks=Hooks(before_execute=checkpoint),
                session_id=sid,
                transcript=transcript or (),
                spent=spent,
                template=template,
                mcp=toolset if toolset is not None else (),
                approvals=request.approvals,
                approval_timeout_s=request.approval_timeout_s,
                network=network,
            )
        except BaseException:
            await self._close_model(sid, model)
            raise
        live = Live(sid=sid, session=session, journal=journal, model=model)
        holder.append(live)
        return live

    async def _start(self, live: Live) -> None:
        """Start *live*'s kernel, persist its events from now on and count it as live here.

        On failure its model is closed and the error raised (KernelStartError ...).
        """
        try:
            await live.session.start()
        except BaseException:
            await self._discard(live)
            raise
        live.idle.set()
        live.journal.attach(live.session, transcript=list(live.session.messages))
        self._live[live.sid] = live

    async def _discard(self, live: Live) -> None:
        """Close a session that never became live (its kernel stopped, its model closed)."""
        try:
            await live.session.aclose()
        finally:
            await self._close_model(live.sid, live.model)

    async def _close_model(self, sid: str, model: Model) -> None:
        try:
            await model.aclose()
        except Exception:
            log.exception("session %s: closing its model failed", sid)

    async def _send(self, live: Live, text: str) -> None:
        """Accept a new user message: record it (with a fresh id) once, then deliver it.

        From its first look at the record until the session has the message, the message
        counts in ``live.sending``: a run that ends meanwhile (its ``SessionEnded`` may be
        written by this very append) leaves the record ``running``, for the run this message
        starts. Otherwise the record could say ``finished`` while that run goes on, and a crash
        during it would leave a run no restarted server resumes.
        """
        live.sending += 1
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
            await live.session.send(text)
        finally:
            live.sending -= 1

    async def _reopen(self, live: Live) -> None:
        async with live.record_lock:  # not while a run's end is being recorded
            record = await self._record(live.sid)
            if record.status != "running":
                await self.store.reopen_session(live.sid, owner=self.owner)

    async def _ended(self, live: Live, result: dict[str, Any], *, more: bool = False) -> None:
        """A run of *live* ended with *result* (its ``SessionEnded`` is durable).

        A message accepted while the run was ending that it never took in is still queued in
        the session: a new run starts at once (by a note, not by sending the message again) and
        the record stays ``running``, so a crash now resumes and answers it. *more*: the caller
        sends messages next (a resume), so the record stays ``running`` too; so it does while
        a message is being accepted (``live.sending``: it starts the next run) or another run
        already runs (its own end records the session).
        """
        async with live.record_lock:  # a message's reopen sees the record before or after this
            late = (
                bool(live.journal.untaken)
                and result.get("status") != "cancelled"
                and not live.session.running
                and self._live.get(live.sid) is live
            )
            busy = live.sending > 0 or live.session.running
            if not (late or more or busy):
                status = _STATUS.get(str(result.get("status")), "failed")
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

    def drop(self, sid: str, exc: BaseException) -> None:
        """Stop running session *sid* here (its ownership was lost); its record is left as is."""
        live = self._live.pop(sid, None)
        if live is not None:
            log.error("session %s stopped", sid, exc_info=exc)
            task = asyncio.get_running_loop().create_task(self._close_dropped(live))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_dropped(self, live: Live) -> None:
        try:
            await live.session.aclose()
        except Exception:
            log.exception("session %s: closing it after it was stopped failed", live.sid)
        await self._close_model(live.sid, live.model)
        live.idle.set()
        self.signals.fire(live.sid)

    async def _shutdown(self, live: Live, *, finish: bool) -> None:
        self._live.pop(live.sid, None)
        if not finish:
            live.journal.failed = ConflictError("the server is shutting down")  # write nothing more
        try:
            await live.session.aclose()
            await live.journal.aclose()
            await self._close_model(live.sid, live.model)
            if finish:
                record = await self.store.get_session(live.sid)
                if record is not None and record.status == "running":
                    await self._record_deleted(live.sid)
            try:
                await self.store.release(live.sid, owner=self.owner)
            except Exception:
                log.exception("session %s: releasing it failed", live.sid)
        finally:
            live.idle.set()
            self.signals.fire(live.sid)

    async def _record_deleted(self, sid: str) -> None:
        try:
            await self.store.finish_session(
                sid, status="cancelled", result={"error": "deleted"}, owner=self.owner
            )
        except Exception:
            log.exception("session %s: recording that it was deleted failed", sid)


def pin_files(request: CreateSession) -> CreateSession:
    """*request* with each file input resolved (``realpath``) and its size and mtime recorded.

    Raises UsageError (one sentence) for a missing path, one that is not a regular file, or a
    name that is also a value input.
    """
    if not request.files:
        return request
    pinned: dict[str, FileInputIn] = {}
    for name, spec in request.files.items():
        if name in request.inputs:
            raise UsageError(f"input {name!r} is given both as a value and as a file")
        path = os.path.realpath(spec.path)
        try:
            info = os.stat(path)
        except OSError as exc:
            raise UsageError(
                f"input {name!r}: {spec.path} cannot be bound: {exc.strerror}"
            ) from None
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"input {name!r}: {spec.path} is not a regular file")
        pinned[name] = FileInputIn(path=path, size=info.st_size, mtime_ns=info.st_mtime_ns)
    return request.model_copy(update={"files": pinned})


def bound_files(files: Mapping[str, FileInputIn]) -> dict[str, File]:
    """The File inputs of a session, checked against what its config recorded.

    Raises UsageError (one sentence) when a file is gone or changed (its size or modification
    time differs): a resumed session binds the file it started with, or nothing.
    """
    out: dict[str, File] = {}
    for name, spec in files.items():
        try:
            info = os.stat(spec.path)
        except OSError as exc:
            raise UsageError(
                f"input {name!r}: {spec.path} is gone ({exc.strerror}); the session was "
                "started with it and binds nothing else"
            ) from None
        recorded = (spec.size, spec.mtime_ns)
        if not stat.S_ISREG(info.st_mode) or recorded != (info.st_size, info.st_mtime_ns):
            raise UsageError(
                f"input {name!r}: {spec.path} changed since the session started (its size or "
                "modification time differs); a resumed session binds only the file it started with"
            )
        out[name] = File(spec.path)
    return out
