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

A session counts against ``max_sessions`` while it is live here (holding or starting a kernel).
An idle one gives its kernel and its slot back after ``session_idle_s``, or at once when a new
or resumed session needs the slot (:mod:`sunroom.service.idle`), and its next message resumes
it from its log as after a crash. Creations and resumes do not wait for each other: a slot is
reserved under a short lock, and kernels start concurrently, at most :data:`CONCURRENT_STARTS`
at a time.

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
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Final, final

from sunroom.errors import ApprovalNotPending, UsageError
from sunroom.sandbox.backends.choice import JUPYTER, describe_backend
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.service import idle, leases
from sunroom.service.build import SessionBuilder, close_model
from sunroom.service.codec import jsonable
from sunroom.service.config import ServiceConfig
from sunroom.service.file_inputs import bound_files, pin_files
from sunroom.service.live import Identity, Live, ModelResolver, new_owner, stable_owner
from sunroom.service.probes import NO_PROBE, Probe
from sunroom.service.problems import CapacityError, ConflictError, NotFoundError, public_message
from sunroom.service.recovery import MESSAGE_RECEIVED
from sunroom.service.resume import SessionResume
from sunroom.service.runs import LATE_NOTE, record_status
from sunroom.service.schemas import CreateSession
from sunroom.service.signals import Signals
from sunroom.service.stalls import Stalls, is_store_fault
from sunroom.service.templates import Templates
from sunroom.store import EventStore, SessionRecord, SessionStatus, SQLiteStore

__all__ = [
    "CONCURRENT_STARTS",
    "KERNEL_STARTED",
    "KERNEL_START_FAILED",
    "LATE_NOTE",
    "ModelResolver",
    "SessionManager",
    "bound_files",
    "new_owner",
    "pin_files",
]

log = logging.getLogger("sunroom.service")

CONCURRENT_STARTS: Final = 32
"""Session kernels (of creations and resumes) started at once at most; the others wait."""

KERNEL_STARTED: Final = "KernelStarted"
"""Kind of the event saying that a session's kernel is up (payload ``seconds``: how long the
start took); written by a session created in the background (:meth:`SessionManager.create`)."""

KERNEL_START_FAILED: Final = "KernelStartFailed"
"""Kind of the event saying that a session's kernel did not start (payload ``error``, one line
without host paths); the session's record is then ``failed``."""


@final
class SessionManager(SessionResume):
    """Runs, persists and resumes sessions for one service process.

    Args:
        store: an open store (the caller closes it after :meth:`aclose`).
        config: limits, defaults, lease length.
        resolve_model: builds a model from a session's ``model``/``base_url``.
        functions: host functions offered to every session (their calls are recorded).
        owner: this process's owner string (default: :func:`new_owner`).
        probe: told what the sessions do (the service's metrics; default: nothing).
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
        probe: Probe = NO_PROBE,
    ) -> None:
        self.store = store
        self.probe = probe
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
            probe=probe,
        )
        self._lock = asyncio.Lock()  # orders slot reservations (held briefly, never for a start)
        self._reserved = 0  # slots taken by sessions being created or resumed
        self._starts = asyncio.Semaphore(CONCURRENT_STARTS)
        self._resume_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self._released = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start lease renewal and, when configured, resuming its own and orphaned sessions."""
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(leases.renew_forever(self), name="sunroom-renew"))
        task = loop.create_task(idle.release_idle_forever(self), name="sunroom-idle")
        self._tasks.append(task)
        if self.config.resume_orphans:  # a server, not `sunroom sessions resume ID`
            task = loop.create_task(leases.reclaim_own(self), name="sunroom-reclaim")
            self._tasks.append(task)
            task = loop.create_task(leases.resume_forever(self), name="sunroom-orphans")
            self._tasks.append(task)

    async def aclose(self) -> None:
        """Stop every live session and the background tasks.

        A stopped session's record stays ``running``: another process (or this one, started
        again) resumes it once the lease runs out (at once: its lease is released).
        Idempotent: a second call (after a drain closed it) does nothing.
        """
        if self._closed:
            return
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
        """Sessions this process runs (holding a kernel) or is starting now.

        What ``max_sessions`` counts; sessions released while idle are not among them.
        """
        return len(self._live) + self._reserved

    @property
    def idle_count(self) -> int:
        """Live sessions that are idle now (no run, nothing holding them): releasable.

        Reads flags only (no approval queue), so the health gate's thread may call it.
        """
        lives = list(self._live.values())  # one C-level copy: safe against the loop's changes
        return sum(1 for x in lives if x.idle.is_set() and x.sending == 0 and x.holds == 0)

    @property
    def released(self) -> int:
        """Sessions this process released while idle since it started (they stay stored)."""
        return self._released

    def live_sessions(self) -> list[Live]:
        """The sessions this process runs now."""
        return list(self._live.values())

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

    async def create(
        self,
        request: CreateSession,
        *,
        session_id: str | None = None,
        background: bool = False,
    ) -> str:
        """Start a new session (and its first run when the request has a task); its id.

        Everything a request can get wrong (no model, an unknown provider or backend, a missing
        API key, bad limits, budget or schema) is checked before the session is recorded, so a
        refused request leaves nothing in the store. *session_id* is the id to use (default: a
        fresh one); a caller that may be interrupted picks it first, to know what to resume.

        With *background* (the HTTP route), it returns once the session is recorded (and its
        task, as its ``MessageReceived``): the kernel starts in a task, at most
        :data:`CONCURRENT_STARTS` at once, and the log says how it went, ``KernelStarted`` or
        ``KernelStartFailed`` (the record then ``failed``); the task runs once it is up. A
        message or file request meanwhile waits for the start.

        Raises CapacityError, UsageError (bad options, no model), AuthenticationError (no API
        key), KernelStartError / SandboxUnavailableError (without *background*: the kernel did
        not start; the session is recorded ``failed``, or ``cancelled`` when the start was
        cancelled).
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
        async with self._slot():
            live = await self._builder.build(
                sid, request, next_seq=1, first_call=1, transcript=None, generation=1
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
            if background:
                await self._start_in_background(live, request.task)
                return sid
            try:
                await self._start(live)
            except BaseException as exc:
                await self._record_failed(sid, exc)
                raise
        try:
            if request.task is not None:
                await self._send(live, request.task)
        finally:
            self._unhold(live)
        return sid

    async def _start_in_background(self, live: Live, task: str | None) -> None:
        """Make *live* live here now and start its kernel in a task (see :meth:`create`).

        Its *task* is recorded (``MessageReceived``) before this returns and sent once the
        kernel is up. On a failure to record it, the session is recorded ``failed`` and the
        error raised.
        """
        mid: str | None = None
        if task is not None:
            mid = uuid.uuid4().hex
            try:
                await live.journal.append(MESSAGE_RECEIVED, {"id": mid, "text": task})
            except BaseException as exc:
                await self._discard(live)
                await self._record_failed(live.sid, exc)
                raise
        live.holds += 1  # the start task's, until the task is sent
        self._live[live.sid] = live
        live.starting = asyncio.get_running_loop().create_task(
            self._background_start(live, mid, task), name=f"sunroom-start-{live.sid[:8]}"
        )

    async def _background_start(self, live: Live, mid: str | None, task: str | None) -> None:
        sid = live.sid
        began = time.monotonic()
        try:
            try:
                async with self._starts:
                    await live.session.start()
            except BaseException as exc:
                live.start_error = exc
                live.started.set()
                live.idle.set()
                if self._live.get(sid) is live:  # not deleted or stopped meanwhile
                    del self._live[sid]
                    await self._start_failed(live, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            live.journal.attach(live.session, transcript=list(live.session.messages))
            live.started.set()
            live.touch()
            try:
                await live.journal.append(
                    KERNEL_STARTED, {"seconds": round(time.monotonic() - began, 3)}
                )
                if task is None:
                    live.idle.set()
                else:
                    await self._deliver(live, mid, task, reopen=False)
            except Exception:
                log.exception("session %s: starting its first run failed", sid)
                live.idle.set()
        finally:
            self._unhold(live)
            self.signals.fire(sid)

    async def _start_failed(self, live: Live, exc: BaseException) -> None:
        """Record that *live*'s kernel did not start (an event, the record), then close it."""
        if isinstance(exc, Exception):
            log.error("session %s: its kernel did not start", live.sid, exc_info=exc)
            try:
                await live.journal.append(KERNEL_START_FAILED, {"error": public_message(exc)})
            except Exception:
                log.exception(
                    "session %s: recording that its kernel did not start failed", live.sid
                )
        await live.journal.aclose()
        await self._record_failed(live.sid, exc)
        await self._discard(live)

    async def _started(self, live: Live) -> None:
        """Wait until *live*'s kernel start ended. Raises the error it failed with."""
        await live.started.wait()
        if live.start_error is not None:
            raise ConflictError(
                f"the session's kernel did not start: {public_message(live.start_error)}"
            )

    async def _stop_starting(self, live: Live) -> None:
        """Cancel *live*'s background kernel start, if it still runs, and wait for it."""
        task = live.starting
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])

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
        live = self._live.get(sid)
        if live is not None:
            await self._send(live, text)
            return
        live = await self._resume_held(sid)  # held until the message is in
        try:
            await self._send(live, text)
        finally:
            self._unhold(live)

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
            raise ConflictError(
                "the session's kernel is not running in this server (it ended, was released "
                "while idle, or another server runs it)"
            )
        live.touch()
        await self._started(live)
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
        live.touch()
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
        live.touch()
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

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """Hold a ``max_sessions`` slot while a session is created or resumed in the block.

        When every slot is taken, the least recently used idle session is released first (its
        kernel stopped before the block runs); with none idle, CapacityError (429). The slot
        is the session's own once it is made live (:meth:`_start`).
        """
        async with self._lock:  # brief: choosing a victim and counting are one step
            victim: asyncio.Task[None] | None = None
            if len(self._live) + self._reserved >= self.config.max_sessions:
                lru = idle.least_recently_used(self._live.values())
                if lru is None:
                    raise CapacityError(
                        f"this server runs its limit of {self.config.max_sessions} sessions, "
                        "none of them idle"
                    )
                victim = self._begin_release(lru)
            self._reserved += 1
        try:
            if victim is not None:  # its processes are gone before another kernel starts
                await asyncio.shield(victim)
            yield
        finally:
            self._reserved -= 1

    @contextlib.asynccontextmanager
    async def _one_resume(self, sid: str) -> AsyncIterator[None]:
        """Resumes of session *sid* run one at a time (other sessions' do not wait)."""
        lock, users = self._resume_locks.get(sid, (asyncio.Lock(), 0))
        self._resume_locks[sid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._resume_locks[sid]
            if users == 1:
                del self._resume_locks[sid]
            else:
                self._resume_locks[sid] = (lock, users - 1)

    async def _released_here(self, sid: str) -> None:
        """Wait until a release of *sid* in progress (its journal flushed) is complete."""
        while (task := self._releasing.get(sid)) is not None:
            await asyncio.wait([task])

    def _unhold(self, live: Live) -> None:
        live.holds -= 1
        live.touch()

    @contextlib.contextmanager
    def holding(self, sid: str) -> Iterator[None]:
        """Keep session *sid* from being released while idle during the block (an SSE reader).

        A no-op for a session not live here.
        """
        live = self._live.get(sid)
        if live is None:
            yield
            return
        live.holds += 1
        try:
            yield
        finally:
            self._unhold(live)

    async def release(self, sid: str) -> bool:
        """Release session *sid* if it is live here and idle (:mod:`sunroom.service.idle`).

        Its kernel is stopped, its journal flushed, its model closed and its lease given up; it
        stays in the store and its next message resumes it from its log. A record still saying
        ``running`` (no run ever ended, or recording the last end failed) is first ended as a
        resume would end it: with the last run's result, else ``cancelled``. Whether it was
        released; a failure is logged (the session is no longer live here either way).
        """
        live = self._live.get(sid)
        if live is None or not idle.is_idle(live):
            return False
        await asyncio.shield(self._begin_release(live))
        return True

    def _begin_release(self, live: Live) -> asyncio.Task[None]:
        """Take *live* out of the live sessions now; its release runs in a task (returned)."""
        del self._live[live.sid]
        task = asyncio.get_running_loop().create_task(
            self._release(live), name=f"sunroom-release-{live.sid[:8]}"
        )
        self._releasing[live.sid] = task
        self._closing.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._closing.discard(t)
            if self._releasing.get(live.sid) is t:
                del self._releasing[live.sid]

        task.add_done_callback(done)
        return task

    async def _release(self, live: Live) -> None:
        sid = live.sid
        try:
            await live.session.aclose()  # the kernel's processes are gone on return
            await live.journal.aclose()
            await close_model(sid, live.model)
            record = await self.store.get_session(sid)
            if record is not None and record.status == "running":
                result = live.last_result or {"status": "cancelled", "session_id": sid}
                status = record_status(result)
                await self.store.finish_session(sid, status=status, result=result, owner=self.owner)
            await self.store.release(sid, owner=self.owner)
            self._released += 1
            log.info("session %s released while idle", sid)
        except Exception:
            log.exception("session %s: releasing it while idle failed", sid)
        finally:
            live.idle.set()
            self.signals.fire(sid)

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
            async with self._starts:
                await live.session.start()
        except BaseException:
            await self._discard(live)
            raise
        live.started.set()
        live.idle.set()
        live.journal.attach(live.session, transcript=list(live.session.messages))
        live.holds += 1  # the caller's until it is done with it (see _unhold)
        live.touch()
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
        await self._stop_starting(live)
        try:
            await live.session.aclose()
        except Exception:
            log.exception("session %s: closing it after it was stopped failed", live.sid)
        await close_model(live.sid, live.model)
        live.idle.set()
        self.signals.fire(live.sid)

    async def _shutdown(self, live: Live, *, finish: bool) -> None:
        self._live.pop(live.sid, None)
        await self._stop_starting(live)
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
