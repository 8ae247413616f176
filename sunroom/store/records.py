"""What the store holds, as frozen dataclasses: sessions, events and call records.

Payloads, configs, arguments and results are JSON objects (``dict[str, Any]`` that
``json.dumps`` accepts, without NaN or infinities); the store keeps them as JSON text and hands
back fresh dicts on every read, so mutating a returned dict changes nothing stored.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, final, get_args

from sunroom.errors import UsageError

__all__ = [
    "CALL_OUTCOMES",
    "SESSION_STATUSES",
    "CallOutcome",
    "CallRecord",
    "JSONObject",
    "KernelPlacement",
    "NewEvent",
    "ReplicaRecord",
    "SessionRecord",
    "SessionStatus",
    "StoredEvent",
    "idempotency_key",
]

JSONObject: TypeAlias = dict[str, Any]
"""A JSON object: str keys; values JSON-able (str, int, float, bool, None, lists, dicts)."""

SessionStatus: TypeAlias = Literal["running", "finished", "failed", "cancelled", "interrupted"]
"""Where a session stands.

``running``: being run, or resumable (its owner may have died; its lease says). ``finished``,
``failed``, ``cancelled``: a run reached that end (a session may be reopened for another run).
``interrupted``: its owner died and whoever noticed chose not to resume it.
"""

CallOutcome: TypeAlias = Literal["ok", "error", "unknown"]
"""How a recorded call ended; ``unknown`` when it started but its process died first."""

SESSION_STATUSES: Final[tuple[SessionStatus, ...]] = get_args(SessionStatus)
CALL_OUTCOMES: Final[tuple[CallOutcome, ...]] = get_args(CallOutcome)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An event to append: ``seq`` (1, 2, 3 ... per session), ``kind``, ``payload``, ``ts``.

    ``ts`` is the wall-clock time the event happened (``time.time()``), chosen by the caller.
    """

    seq: int
    kind: str
    payload: JSONObject
    ts: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StoredEvent:
    """An event as the log holds it: what was appended, and the session it belongs to."""

    session_id: str
    seq: int
    kind: str
    payload: JSONObject
    ts: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """A session's run record.

    Attributes:
        session_id: the id it was created with.
        status: see :data:`SessionStatus`.
        config: what it was created with (model, preset, limits ...), as given.
        result: what :meth:`finish_session` recorded (None while running).
        created_at / updated_at: when it was created / last changed (status, owner or lease).
        finished_at: when it last reached a status other than ``running`` (None while running).
        owner: who may write its log now (None: nobody); see ``EventStore.claim``.
        lease_expires_at: after this time another owner may claim it (None when unowned).
        generation: the fencing generation: 0 for a session never owned, 1 once created
            owned, and one more each time a :meth:`~sunroom.store.seam.EventStore.claim`
            changes hands. A write that names a generation is refused unless it is current,
            so an owner that lost the session can never write for it again, even after it
            takes the session back.
    """

    session_id: str
    status: SessionStatus
    config: JSONObject
    result: JSONObject | None
    created_at: float
    updated_at: float
    finished_at: float | None
    owner: str | None
    lease_expires_at: float | None
    generation: int = 0


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """A tool call or host call, recorded before it ran; ``outcome`` is None until it ends.

    Attributes:
        session_id / call_id: which call (``call_id`` is unique within its session).
        name / args: the function called and its arguments, as recorded at the start.
        side_effect: whether the call changes the world (never replayed after a crash).
        started_at / started_by: when, and by which owner, the start was recorded.
        outcome: ``ok`` / ``error`` as the call reported it, ``unknown`` when its process died
            before it finished (see ``EventStore.mark_unknown``), None while unfinished.
        result: what the call returned or the error it raised (JSON), None while unfinished.
        finished_at: when the outcome was recorded.
    """

    session_id: str
    call_id: str
    name: str
    args: JSONObject
    side_effect: bool
    started_at: float
    started_by: str
    outcome: CallOutcome | None
    result: JSONObject | None
    finished_at: float | None

    @property
    def finished(self) -> bool:
        """Whether the call has its one outcome (``unknown`` included)."""
        return self.outcome is not None

    @property
    def idempotency_key(self) -> str:
        """``idempotency_key(self.session_id, self.call_id)``."""
        return idempotency_key(self.session_id, self.call_id)


_IDEMPOTENCY_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "sunroom:idempotency-key:v1")


def idempotency_key(session_id: str, call_id: str) -> str:
    """A stable idempotency key for one call: the same inputs give the same key, forever.

    Host functions with side effects can pass it to a remote API (an ``Idempotency-Key``
    header, a client token) so that a call repeated by hand after a crash is not done twice.
    It is the RFC 4122 version-5 UUID, in its 36-character text form, of
    ``json.dumps([session_id, call_id])`` in the namespace
    ``uuid5(NAMESPACE_URL, "sunroom:idempotency-key:v1")``. It reveals neither id, and fits
    APIs that require a UUID or cap keys at 36+ characters.

    Raises UsageError when either id is not a non-empty str.
    """
    for label, value in (("session_id", session_id), ("call_id", call_id)):
        if not isinstance(value, str) or not value:
            raise UsageError(f"{label} must be a non-empty str, got {value!r}")
    return str(uuid.uuid5(_IDEMPOTENCY_NAMESPACE, json.dumps([session_id, call_id])))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaRecord:
    """A ``sunroom serve`` replica as its last heartbeat described it.

    Attributes:
        replica_id: the replica's owner string (the one its session writes name).
        url: the internal base URL other replicas forward its sessions' writes to.
        load: sessions and kernels it runs now.
        capacity: how many sessions and kernels it may run.
        draining: it is shutting down and takes no new work.
        heartbeat_at / expires_at: when it last said so / when the record lapses unless renewed.
    """

    replica_id: str
    url: str
    load: int
    capacity: int
    draining: bool
    heartbeat_at: float
    expires_at: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class KernelPlacement:
    """Where a raw kernel of the service lives: the replica that started (and holds) it."""

    kernel_id: str
    replica_id: str
    created_at: float
