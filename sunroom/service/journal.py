"""Durability for one live session: :class:`Journal` (its event log) and :class:`CallLedger`.

The journal subscribes to the session's events and appends them to the store in publication
order, in batches, each batch in one transaction; only then does it wake SSE readers, which
read from the store: an event is durable before any client sees it. With each batch it
appends a ``Transcript`` event when the model transcript grew (the new messages) or was
compacted (all of it), so a resumed session gets the exact transcript back; its ``taken`` names
the ids of the user messages (:meth:`Journal.expect`) that reached the transcript with it, so a
resume knows exactly which accepted messages no run took in.
:meth:`Journal.flush` makes everything published so far durable; the service runs it before
every cell (``Hooks.before_execute``) so that the model reply asking for a cell is on disk
before the cell runs.

The ledger wraps host functions: each call is recorded in the store before it runs and gets
exactly one outcome; a function with an ``idempotency_key`` parameter receives the key of
(session id, call id), and the kernel never sees that parameter.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import final

from sunroom.agent import events as ev
from sunroom.agent.bus import Subscription
from sunroom.agent.session import AsyncSession
from sunroom.errors import StoreError
from sunroom.providers import Message, UserMessage
from sunroom.sandbox.functions import HostFunction
from sunroom.service.codec import event_to_json, jsonable, message_to_json
from sunroom.service.probes import EventObserver
from sunroom.store import CallRecord, EventStore, NewEvent, idempotency_key

__all__ = ["KEY_PARAMETER", "TRANSCRIPT", "CallLedger", "Journal"]

log = logging.getLogger("sunroom.service")

TRANSCRIPT = "Transcript"
"""Kind of the events that carry the model transcript (never sent to SSE clients)."""

KEY_PARAMETER = "idempotency_key"
"""A host function parameter of this name receives the call's idempotency key."""

_PUMP_BUFFER = 1_000_000


@final
class Journal:
    """Appends one session's events to the store, in order, then wakes readers.

    Args:
        store: the store; the caller owns the session there (*owner*).
        session_id: the service's session id.
        owner: this process's owner string.
        generation: the lease's fencing generation, named in every write (None: owner only).
        next_seq: the seq the next event gets (the store's last seq + 1).
        notify: called after every durable append (wakes SSE readers).
        on_ended: awaited with the run result's JSON after a ``SessionEnded`` is durable
            (with the journal's lock held: it must not append or flush).
        on_failed: called once when a write fails (lost ownership, I/O): the session must stop.

    ``observe``, when set, is told every event the session publishes, in order, as it is
    taken for the store (the service's metrics).
    """

    def __init__(
        self,
        store: EventStore,
        session_id: str,
        *,
        owner: str,
        next_seq: int,
        notify: Callable[[], None],
        generation: int | None = None,
        on_ended: Callable[[dict[str, object]], Awaitable[None]],
        on_failed: Callable[[BaseException], None],
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.owner = owner
        self.generation = generation
        self._seq = next_seq
        self._notify = notify
        self._on_ended = on_ended
        self._on_failed = on_failed
        self._lock = asyncio.Lock()
        self._pending: list[ev.Event] = []
        self._sub: Subscription | None = None
        self._session: AsyncSession | None = None
        self._recorded: list[Message] = []
        self._ended: list[dict[str, object]] = []
        self._expected: list[tuple[str, str]] = []
        self._task: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None
        self.observe: EventObserver | None = None

    @property
    def last_seq(self) -> int:
        """The seq of the last event appended."""
        return self._seq - 1

    def attach(self, session: AsyncSession, *, transcript: list[Message]) -> None:
        """Start persisting *session*'s events; *transcript* is what the store already holds."""
        self._session = session
        self._recorded = list(transcript)
        self._sub = session.events(maxsize=_PUMP_BUFFER)
        self._task = asyncio.get_running_loop().create_task(
            self._pump(), name=f"sunroom-journal-{self.session_id[:8]}"
        )

    def expect(self, message_id: str, text: str) -> None:
        """Note that user message *message_id* is about to be sent as exactly *text*.

        The ``Transcript`` event that first carries a user message of that text names the id in
        its ``taken`` (the oldest expected id of that text wins; each id is taken once).
        """
        self._expected.append((message_id, text))

    @property
    def untaken(self) -> list[str]:
        """Ids of the messages sent (:meth:`expect`) that no transcript took in yet."""
        return [mid for mid, _ in self._expected]

    async def append(self, kind: str, payload: dict[str, object]) -> int:
        """Append one service event (after everything the session published before it).

        Its seq once it is durable. Raises StoreError when it was not stored: this write or an
        earlier one failed (the session was stopped through ``on_failed``), so a caller never
        reports an event as recorded that is not.
        """
        async with self._lock:
            batch = self._collect()
            seq = self._seq + len(batch)
            batch.append(NewEvent(seq=seq, kind=kind, payload=payload, ts=time.time()))
            await self._write(batch)
            if self.failed is not None:
                raise StoreError(
                    "the session's events can no longer be stored here; it was stopped"
                ) from self.failed
            return seq

    async def flush(self) -> None:
        """Make every event published so far (and the transcript) durable."""
        async with self._lock:
            await self._write(self._collect())

    async def _pump(self) -> None:
        assert self._sub is not None
        async for event in self._sub:
            self._pending.append(event)  # no await between taking it and queueing it: order
            async with self._lock:
                await self._write(self._collect())

    def _collect(self) -> list[NewEvent]:
        """Everything published and not yet written, as numbered events (lock held)."""
        taken = self._pending
        self._pending = []
        if self._sub is not None:
            while (e := self._sub.get_nowait()) is not None:
                taken.append(e)
        out: list[NewEvent] = []
        seq = self._seq
        for e in taken:
            if self.observe is not None:
                self.observe(e)
            kind, payload = event_to_json(e, session_id=self.session_id)
            if isinstance(e, ev.SessionEnded):
                result = payload["result"]
                assert isinstance(result, dict)  # a RunResult's JSON (event_to_json)
                self._ended.append(result)
                # the run's transcript goes before its end, so the log says the run answered
                # the messages it took in
                delta = self._transcript_delta()
                if delta is not None:
                    out.append(NewEvent(seq=seq, kind=TRANSCRIPT, payload=delta, ts=time.time()))
                    seq += 1
            out.append(NewEvent(seq=seq, kind=kind, payload=payload, ts=e.ts))
            seq += 1
        delta = self._transcript_delta()
        if delta is not None:
            out.append(NewEvent(seq=seq, kind=TRANSCRIPT, payload=delta, ts=time.time()))
        return out

    def _transcript_delta(self) -> dict[str, object] | None:
        if self._session is None:
            return None
        current = self._session.messages
        old = self._recorded
        n = len(old)
        if len(current) >= n and all(a is b or a == b for a, b in zip(current, old, strict=False)):
            start = n
        else:
            start = 0  # compacted: record it whole
        if start == len(current) and start == n:
            return None
        self._recorded = list(current)
        added = current[start:]
        out: dict[str, object] = {"start": start, "messages": [message_to_json(m) for m in added]}
        taken = self._take(added)
        if taken:
            out["taken"] = taken
        return out

    def _take(self, added: Sequence[Message]) -> list[str]:
        """The expected ids whose text is among *added*'s user messages (removed from the list)."""
        taken: list[str] = []
        for m in added:
            if not isinstance(m, UserMessage) or not self._expected:
                continue
            i = next((i for i, (_, t) in enumerate(self._expected) if t == m.text), None)
            if i is not None:
                taken.append(self._expected.pop(i)[0])
        return taken

    async def _write(self, batch: list[NewEvent]) -> None:
        if not batch or self.failed is not None:
            self._ended.clear()
            return
        try:
            await self.store.append(
                self.session_id, batch, owner=self.owner, generation=self.generation
            )
        except Exception as exc:
            self.failed = exc
            log.error("session %s: the store refused its events", self.session_id, exc_info=exc)
            self._on_failed(exc)
            return
        self._seq += len(batch)
        self._notify()
        ended, self._ended = self._ended, []
        for result in ended:
            await self._on_ended(result)

    async def aclose(self) -> None:
        """Write what is left, then stop the pump (the session must be closed first).

        The pump gets 5 s to drain; a failure to write is logged (and was reported through
        ``on_failed`` when it happened). The caller's own cancellation propagates.
        """
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5.0)
            if not self._task.done():
                log.error("session %s: its events were not written within 5 s", self.session_id)
                self._task.cancel()
                await asyncio.wait([self._task])
            elif not self._task.cancelled() and self._task.exception() is not None:
                log.error(
                    "session %s: writing its events failed",
                    self.session_id,
                    exc_info=self._task.exception(),
                )
        if self._sub is not None:
            self._sub.close()
        try:
            await self.flush()
        except Exception:
            log.exception("session %s: writing its last events failed", self.session_id)


_MARKING: set[asyncio.Future[CallRecord]] = set()
"""Markings of cancelled calls in flight (a strong reference until each is done)."""


def _log_marking(session_id: str, call_id: str, task: asyncio.Future[CallRecord]) -> None:
    """Log a failure to mark a cancelled call's outcome unknown (a done callback)."""
    _MARKING.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error(
            "session %s: call %s was cancelled and marking its outcome unknown failed",
            session_id,
            call_id,
            exc_info=task.exception(),
        )


@final
class CallLedger:
    """Wraps host functions so that every call is recorded before it runs (see the module).

    *first_call* is the number the next call id gets (call ids are ``"1"``, ``"2"`` ... per
    session, continuing across resumes).
    """

    def __init__(
        self,
        store: EventStore,
        session_id: str,
        *,
        owner: str,
        first_call: int,
        generation: int | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.owner = owner
        self.generation = generation
        self._ids = itertools.count(first_call)

    def wrap(self, hf: HostFunction) -> HostFunction:
        """A copy of *hf* whose calls are recorded; ``idempotency_key`` is filled in, hidden."""
        sig = hf.signature
        takes_key = KEY_PARAMETER in sig.parameters
        visible = sig.replace(
            parameters=[p for p in sig.parameters.values() if p.name != KEY_PARAMETER]
        )
        fn, is_async, name, side_effect = hf.fn, hf.is_async, hf.name, not hf.idempotent
        store, sid = self.store, self.session_id

        async def recorded(**kwargs: object) -> object:  # its annotations are set below
            call_id = str(next(self._ids))
            await store.record_call_started(
                sid, call_id, name=name, args=jsonable(kwargs), side_effect=side_effect,
                owner=self.owner,
            )  # fmt: skip
            if takes_key:
                kwargs[KEY_PARAMETER] = idempotency_key(sid, call_id)
            try:
                if is_async:
                    value = await fn(**kwargs)
                else:
                    ctx = contextvars.copy_context()
                    loop = asyncio.get_running_loop()
                    value = await loop.run_in_executor(None, lambda: ctx.run(fn, **kwargs))
            except asyncio.CancelledError:
                # the call may or may not have taken effect; the marking is its own task, so it
                # outlives a second cancel (which propagates), and its failure is logged
                marking = asyncio.ensure_future(
                    store.mark_unknown(sid, call_id, owner=self.owner, generation=self.generation)
                )
                _MARKING.add(marking)
                marking.add_done_callback(functools.partial(_log_marking, sid, call_id))
                await asyncio.wait([marking])
                raise
            except Exception as exc:
                error = {"error": f"{type(exc).__name__}: {exc}"}
                await store.record_call_finished(
                    sid,
                    call_id,
                    outcome="error",
                    result=error,
                    owner=self.owner,
                    generation=self.generation,
                )
                raise
            await store.record_call_finished(
                sid,
                call_id,
                outcome="ok",
                result={"value": jsonable(value)},
                owner=self.owner,
                generation=self.generation,
            )
            return value

        recorded.__name__ = name
        recorded.__qualname__ = name
        recorded.__doc__ = hf.description
        recorded.__signature__ = visible  # type: ignore[attr-defined]
        hints = {p.name: p.annotation for p in visible.parameters.values()}
        hints["return"] = sig.return_annotation
        recorded.__annotations__ = hints
        assert inspect.iscoroutinefunction(recorded)
        return dataclasses.replace(hf, fn=recorded)
