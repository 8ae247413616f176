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

Each concept has its module: how messages start runs and how a run's end is recorded
(:mod:`sunroom.service.runs`), resuming (:mod:`sunroom.service.resume`), building a session
from its request (:mod:`sunroom.service.build`), a session's file inputs
(:mod:`sunroom.service.file_inputs`); this one holds the manager's lifecycle and its API.
:func:`pin_files`, :func:`bound_files` and :data:`LATE_NOTE` are importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any, final

from sunroom.errors import ApprovalNotPending, UsageError
from sunroom.kernel_choice import JUPYTER, describe_backend
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.service import leases
from sunroom.service.build import SessionBuilder, close_model
from sunroom.service.codec import jsonable
from sunroom.service.config import ServiceConfig
from sunroom.service.file_inputs import bound_files, pin_files
from sunroom.service.live import Identity, Live, ModelResolver, new_owner, stable_owner
from sunroom.service.problems import CapacityError, ConflictError, NotFoundError
from sunroom.service.resume import SessionResume
from sunroom.service.runs import LATE_NOTE
from sunroom.service.schemas import CreateSession
from sunroom.service.signals import Signals
from sunroom.service.stalls import Stalls, is_store_fault
from sunroom.service.templates import Templates
from sunroom.store import EventStore, SessionRecord, SessionStatus, SQLiteStore

__all__ = [
    "LATE_NOTE",
    "ModelResolver",
    "SessionManager",
    "bound_files",
    "new_owner",
    "pin_files",
]

log = logging.getLogger("sunroom.service")


@final
class SessionManager(SessionResume):
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
        self._identity: Identity | None = None
        if owner is None and isinstance(store, SQLiteStore) and str(store.path) != ":memory:":
            self._identity = stable_owner(store.path)
        self.owner = owner or (self._identity.owner if self._identity else new_owner())
        self.signals = Signals()
        self.stalls = Stalls(store, owner=self.owner, signals=self.signals)
        """Sessions stopped because their events could not be stored (their end is retried)."""
        self._live: dict[str, Live] = {}
        self._builder = SessionBuilder(
            store=store,
            owner=self.owner,
            config=config,
            templates=templates or Templates(config),
            resolve=resolve_model,
            functions=tuple(functions),
            notify=self.signals.fire,
            on_ended=self._ended,
            on_failed=self.drop,
        )
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
        await self.stalls.aclose()
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
            live = await self._builder.build(
                sid, request, next_seq=1, first_call=1, transcript=None
            )
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
        NotFoundError, OwnedElsewhereError (another live server holds it: 503, Retry-After),
        StoreError (503: the message could not be recorded, or the session stopped because
        its events could not be stored and its end is not recorded yet).
        """
        self.stalls.check(sid)
        live = self._live.get(sid) or await self.resume(sid)
        await self._send(live, text)

    async def result(self, sid: str, *, timeout_s: float) -> tuple[SessionStatus, Any]:
        """Wait up to *timeout_s* for the session's run to end: (status, result JSON).

        Returns ``("running", None)`` when it has not ended in time. A session stopped because
        its events could not be stored answers ``failed`` with its result at once, while its
        record may still say ``running`` (:mod:`sunroom.service.stalls`). Raises NotFoundError.
        """
        live = self._live.get(sid)
        if live is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.idle.wait(), timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            record = await self._record(sid)
            stalled = self.stalls.result(sid)
            if record.status == "running" and stalled is not None:
                return "failed", stalled
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
            await close_model(live.sid, live.model)

    def drop(self, sid: str, exc: BaseException) -> None:
        """Stop running session *sid* here: its ownership was lost, or a write failed.

        Lost ownership leaves its record as is (another process runs it). A store that failed
        to write (a full disk, I/O) ends it ``failed``, its end retried until it is stored
        (:mod:`sunroom.service.stalls`); it is not run again here.
        """
        live = self._live.pop(sid, None)
        if live is not None:
            log.error("session %s stopped", sid, exc_info=exc)
            if is_store_fault(exc):
                self.stalls.stop(sid, exc, next_seq=live.journal.last_seq + 1)
            task = asyncio.get_running_loop().create_task(self._close_dropped(live))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_dropped(self, live: Live) -> None:
        try:
            await live.session.aclose()
        except Exception:
            log.exception("session %s: closing it after it was stopped failed", live.sid)
        await close_model(live.sid, live.model)
        live.idle.set()
        self.signals.fire(live.sid)

    async def _shutdown(self, live: Live, *, finish: bool) -> None:
        self._live.pop(live.sid, None)
        if not finish:
            live.journal.failed = ConflictError("the server is shutting down")  # write nothing more
        try:
            await live.session.aclose()
            await live.journal.aclose()
            await close_model(live.sid, live.model)
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
