"""The seam every store backend provides: :class:`EventStore`.

A store keeps, per session, a *run record* (:class:`~sunroom.store.records.SessionRecord`),
an append-only *event log* (:class:`~sunroom.store.records.StoredEvent`) and *call records*
(:class:`~sunroom.store.records.CallRecord`). Every method is a coroutine and every write is
one atomic transaction: it happens entirely or not at all, and correctness holds across
processes sharing the store, not only across tasks.

**Ownership.** One writer per session. ``owner`` is a string naming one incarnation of a
writer (e.g. ``f"{host}:{pid}:{uuid4().hex}"``; never reuse it after a restart). Writes to a
session's log and calls name their owner and are refused (:class:`StoreConflictError`,
``reason="not_owner"``) unless the session's ``owner`` column is exactly that string. A lease
does not fence writes by itself: it only says when *another* owner may :meth:`claim` the
session. An owner whose lease ran out keeps writing until someone else claims; from then on
its writes are refused, so it must stop when a write says ``not_owner`` or :meth:`renew`
returns False.

**Fencing.** Every change of hands increments the session's ``generation``
(:attr:`~sunroom.store.records.SessionRecord.generation`). Each owner-fenced write takes an
optional ``generation=``: when given, the write is refused like a wrong owner unless the
generation is still current. An owner that reads the generation once it has claimed a session
and names it in its writes can never write for that session again after losing it, even if it
claims the session back later (its new hold has a new generation).

**Replicas.** Several service processes sharing one store (replicas) say they are alive with
:meth:`heartbeat`, which lapses after its time to live; a replica's id is its owner string.
The raw kernels of the service are placed on the replica that holds them (:meth:`place_kernel`),
so another replica can tell a kernel that lives elsewhere from one whose replica died.

Errors: :class:`StoreConflictError` (a write refused, nothing written),
:class:`StoreNotFoundError` (no such session or call), :class:`StoreError` (I/O),
:class:`~sunroom.errors.UsageError` (bad arguments), :class:`~sunroom.errors.ClosedError`
(the store was closed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, Self

from sunroom.store.records import (
    CallOutcome,
    CallRecord,
    JSONObject,
    KernelPlacement,
    NewEvent,
    ReplicaRecord,
    SessionRecord,
    SessionStatus,
    StoredEvent,
)

__all__ = ["AppendFollower", "EventStore"]


class EventStore(Protocol):
    """A durable home for sessions: run records, an append-only event log, call records.

    Use as ``async with store: ...``; leaving it (or :meth:`aclose`) releases its files and
    threads. Acknowledged writes are durable: once a write's coroutine returns, a crash of the
    process (``kill -9``) loses nothing of it.
    """

    async def __aenter__(self) -> Self:
        """Open the store (creating and migrating it when needed); see the backend."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store (:meth:`aclose`)."""

    async def aclose(self) -> None:
        """Close the store; idempotent. Later calls raise ClosedError."""

    # --- sessions -------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str,
        *,
        config: JSONObject,
        created_at: float | None = None,
        owner: str | None = None,
        lease_s: float | None = None,
    ) -> SessionRecord:
        """Record a new ``running`` session; with *owner* and *lease_s*, already claimed by it.

        Raises StoreConflictError (``exists``) when the id is taken.
        """

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session's record, or None when there is none."""

    async def list_sessions(
        self, *, status: SessionStatus | None = None, limit: int = 100
    ) -> list[SessionRecord]:
        """Up to *limit* sessions (of *status* when given), newest first."""

    async def finish_session(
        self,
        session_id: str,
        *,
        status: SessionStatus,
        result: JSONObject | None,
        owner: str | None = None,
        generation: int | None = None,
    ) -> SessionRecord:
        """Record how the session's run ended: any status but ``running``, and its *result*.

        A run ends once: the session must be ``running`` (:meth:`reopen_session` starts
        another run). With *owner*, the caller must own the session; None is an
        administrative override (a cancel, or marking an orphan ``interrupted``, from a
        process that does not own it). Ownership is unchanged: call :meth:`release` when done
        with the session. Raises StoreNotFoundError, StoreConflictError (``not_owner``;
        ``finished``: the run already ended), UsageError (``running`` or an unknown status).
        """

    async def reopen_session(
        self, session_id: str, *, owner: str, generation: int | None = None
    ) -> SessionRecord:
        """Set the owned session ``running`` again (another run, or a resume after a crash).

        Clears ``result`` and ``finished_at``. Raises StoreNotFoundError, StoreConflictError
        (``not_owner``).
        """

    async def orphaned_sessions(self, *, limit: int = 100) -> list[SessionRecord]:
        """``running`` sessions whose owner's lease has expired (or that have none), oldest first.

        These are the sessions a crashed process left behind: claim one, then resume it or
        finish it as ``interrupted``.
        """

    # --- ownership ------------------------------------------------------------------------

    async def claim(self, session_id: str, *, owner: str, lease_s: float) -> bool:
        """Take the session for *owner* until now + *lease_s*; whether it was taken.

        Succeeds (atomically, across processes) when the session has no owner, its lease has
        expired, or *owner* already holds it (then the lease is extended); of several racing
        claimants exactly one wins. A claim that changes hands increments the session's
        ``generation``; read it with :meth:`get_session` to fence later writes. Raises
        StoreNotFoundError, UsageError (*lease_s* <= 0).
        """

    async def renew(
        self, session_id: str, *, owner: str, lease_s: float, generation: int | None = None
    ) -> bool:
        """Extend *owner*'s lease to now + *lease_s*; False when *owner* no longer holds it.

        With *generation*, also False when the session changed hands since (see Fencing).
        """

    async def release(self, session_id: str, *, owner: str, generation: int | None = None) -> bool:
        """Give the session up (no owner); False when *owner* did not hold it (at *generation*).

        The generation is unchanged; the next claim increments it.
        """

    # --- the event log --------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[NewEvent],
        *,
        owner: str,
        generation: int | None = None,
    ) -> int:
        """Append *events* in one transaction; the session's last seq afterwards.

        Their seqs must continue exactly from the last stored seq (``last + 1, last + 2 ...``).
        Raises StoreConflictError (``not_owner`` or ``seq``; nothing written),
        StoreNotFoundError, UsageError (a payload that is not a JSON object). Appending no
        events writes nothing and returns the last seq.
        """

    async def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        """Events with seq > *after_seq* in seq order, at most *limit*; [] for no session.

        Concurrent appends are atomic: a read sees each append whole or not at all, so the
        events read always run ``after_seq + 1, after_seq + 2 ...`` without a gap.
        """

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's last event (0 when none). Raises StoreNotFoundError."""

    # --- call records ---------------------------------------------------------------------

    async def record_call_started(
        self,
        session_id: str,
        call_id: str,
        *,
        name: str,
        args: JSONObject,
        side_effect: bool,
        owner: str,
        generation: int | None = None,
    ) -> CallRecord:
        """Record that a call is about to run; do it BEFORE running the call.

        Raises StoreConflictError (``exists``: this call_id was started before, so do not run
        it again; ``not_owner``), StoreNotFoundError.
        """

    async def record_call_finished(
        self,
        session_id: str,
        call_id: str,
        *,
        outcome: CallOutcome,
        result: JSONObject,
        owner: str,
        generation: int | None = None,
    ) -> CallRecord:
        """Record the call's one outcome (``ok`` or ``error``) and its *result*.

        Raises StoreConflictError (``finished``: it already has an outcome; ``not_started``;
        ``not_owner``), StoreNotFoundError (no session), UsageError (another outcome).
        """

    async def mark_unknown(
        self, session_id: str, call_id: str, *, owner: str, generation: int | None = None
    ) -> CallRecord:
        """Record outcome ``unknown`` for a call whose process died before it finished.

        For resume after a crash: never replay such a call, report it as unknown. Raises
        StoreConflictError (``finished``, ``not_started``, ``not_owner``), StoreNotFoundError.
        """

    async def get_call(self, session_id: str, call_id: str) -> CallRecord | None:
        """The call's record, or None when it was never started."""

    async def calls(self, session_id: str) -> list[CallRecord]:
        """Every call of the session, in the order they started; [] for no session."""

    async def unfinished_calls(self, session_id: str) -> list[CallRecord]:
        """Calls started but without an outcome, in the order they started."""

    # --- retention ------------------------------------------------------------------------

    async def purge(self, *, older_than_s: float, now: float | None = None) -> int:
        """Delete sessions not ``running`` whose ``finished_at`` is over *older_than_s* ago.

        Their events and calls go with them; ``running`` sessions are never purged. Returns
        how many sessions were deleted. *now* defaults to the store's clock.
        """

    # --- replicas -------------------------------------------------------------------------

    async def heartbeat(
        self,
        replica_id: str,
        *,
        url: str,
        load: int,
        capacity: int,
        draining: bool,
        ttl_s: float,
    ) -> ReplicaRecord:
        """Say replica *replica_id* is alive until now + *ttl_s*, with its URL, load and state.

        Inserts or replaces its record. Raises UsageError (an empty id or url, a negative load
        or capacity, *ttl_s* <= 0).
        """

    async def replicas(self) -> list[ReplicaRecord]:
        """The replicas whose heartbeat has not lapsed, ordered by id."""

    async def get_replica(self, replica_id: str) -> ReplicaRecord | None:
        """The replica's record; None when it has none or its heartbeat lapsed."""

    async def leave(self, replica_id: str) -> bool:
        """Delete the replica's record (it stopped); whether it had one."""

    # --- kernel placement -----------------------------------------------------------------

    async def place_kernel(self, kernel_id: str, *, replica_id: str) -> KernelPlacement:
        """Record that replica *replica_id* holds raw kernel *kernel_id*.

        Raises StoreConflictError (``exists``) when the kernel is placed already.
        """

    async def kernel_placement(self, kernel_id: str) -> KernelPlacement | None:
        """Where kernel *kernel_id* lives, or None when it was never placed or was forgotten."""

    async def forget_kernel(self, kernel_id: str) -> bool:
        """Delete the kernel's placement (it was closed); whether it had one."""

    async def kernels_of(self, replica_id: str) -> list[KernelPlacement]:
        """The kernels placed on *replica_id*, oldest first."""


class AppendFollower(Protocol):
    """A store that can tell, without polling, that another process appended events.

    PostgreSQL provides it (LISTEN/NOTIFY); SQLite does not, and its readers poll.
    """

    async def follow(self, on_append: Callable[[str], None]) -> None:
        """Call ``on_append(session_id)`` after each append any process commits, until cancelled.

        Runs on a connection of its own. After that connection is lost it reconnects (with
        backoff) and calls ``on_append("*")`` once: anything may have changed meanwhile.
        """
