"""Rebuilding a session from its log after a crash: :func:`replay`, then :func:`plan`.

Resume is one pass. :func:`replay` folds a session's events (pure, in seq order) into one
:class:`Replay`: the transcript (``Transcript`` events), every accepted user message with its id
and whether a run took it in / answered it (``MessageReceived`` ids matched exactly against the
ids a ``Transcript`` event names in ``taken``), the value an accepted ``submit`` of the open run
carries, the spend, whether a run is open and the approval requests left without an answer.
:func:`plan` alone decides from that state and the calls left without an outcome what the
resumed session does (a :class:`Plan`); the manager only carries the plan out.

An approval request that waited when the process died is denied by the resume (its own
``ApprovalAnswered``, ``by="closed"``, reason :data:`RESTART_DENIAL`): the call never ran (a
call waiting for approval has not started, and has no call record), the cell is not re-run,
and the restart note tells the model. A note lost in a second crash is told again, as for
unknown calls.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, final

from sunroom.agent.budget import Spend
from sunroom.providers import AssistantMessage, Message, ToolResultMessage, Usage, UserMessage
from sunroom.service.codec import message_from_json
from sunroom.service.journal import TRANSCRIPT
from sunroom.store import CallRecord, StoredEvent

__all__ = [
    "CALL_OUTCOME_UNKNOWN",
    "MESSAGE_RECEIVED",
    "RESTART_DENIAL",
    "Plan",
    "ReceivedMessage",
    "Replay",
    "answer_dangling",
    "plan",
    "replay",
    "restart_note",
    "submit_result",
    "unreported_unknown",
    "untold_unknown",
]

MESSAGE_RECEIVED = "MessageReceived"
"""Kind of the event recording a user message (payload ``id``, ``text``), appended once, before
the session gets it; a resume re-sends an untaken message under the same id, unrecorded."""

CALL_OUTCOME_UNKNOWN = "CallOutcomeUnknown"
"""Kind of the event reporting a host call whose process died while it ran (payload
``call_id``, ``name``, ``args``, ``idempotency_key``); a resume appends one per such call."""

RESTART_DENIAL = "the service restarted while this call waited for approval; it did not run"
"""The reason of the denial a resume records for an approval request left waiting."""

APPROVAL_REQUESTED = "ApprovalRequested"
APPROVAL_ANSWERED = "ApprovalAnswered"
RUN_ENDED = "SessionEnded"
USAGE_UPDATED = "UsageUpdated"
SUBMIT_ACCEPTED = "SubmitAccepted"
HOST_CALL_STARTED = "HostCallStarted"
BUDGET_WARNING = "BudgetWarning"
NETWORK_CONNECTION = "NetworkConnection"
EMBEDDING_FUNCTIONS = frozenset({"embed", "search"})
"""The host functions counted against ``Budget.max_embedding_calls`` (sunroom.embeddings)."""


@final
@dataclass(slots=True, kw_only=True)
class ReceivedMessage:
    """One accepted user message as the log tells it.

    Attributes:
        id: its id (``MessageReceived.id``; ``seq-N`` for a log written before ids).
        text: what the user sent.
        seq: the seq of its ``MessageReceived``.
        taken: a run took it into its transcript.
        answered: a run ended after taking it.
    """

    id: str
    text: str
    seq: int
    taken: bool = False
    answered: bool = False


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """What a session's log says.

    Attributes:
        transcript: the model transcript as last recorded.
        messages: every accepted user message, oldest first.
        run_open: a run was in progress (a message received or taken in after the last run
            end).
        submit: ``{"output": value}`` when the open run's ``submit`` was accepted, else None.
        last_result: the result of the last ``SessionEnded`` (None when none).
        last_seq: the seq of the last event.
        spent: the session's spend as its last ``UsageUpdated`` event recorded it, with the
            ``embed``/``search`` calls counted from their ``HostCallStarted`` events (less
            those a ``BudgetWarning`` refused), so a resume keeps ``max_embedding_calls``, and
            the bytes of its ``NetworkConnection`` events (``max_network_bytes``).
        reported_unknown: ids of the calls a ``CallOutcomeUnknown`` event reported.
        untold_unknown: ids of those no ``Transcript`` message mentioned since (as
            :func:`restart_note` does): the model was not told, or the note died with its
            process (an idle session holds it in memory until the next message).
        waiting_approvals: the ``ApprovalRequested`` payloads no ``ApprovalAnswered`` answered
            (the calls waited when the process died), oldest first.
        untold_approvals: the payloads of requests a resume denied (:data:`RESTART_DENIAL`)
            that no ``Transcript`` message mentions since.
    """

    transcript: list[Message]
    messages: list[ReceivedMessage] = field(default_factory=list)
    run_open: bool = False
    submit: dict[str, Any] | None = None
    last_result: dict[str, Any] | None = None
    last_seq: int = 0
    spent: Spend = Spend()
    reported_unknown: frozenset[str] = frozenset()
    untold_unknown: frozenset[str] = frozenset()
    waiting_approvals: tuple[dict[str, Any], ...] = ()
    untold_approvals: tuple[dict[str, Any], ...] = ()

    @property
    def pending(self) -> list[ReceivedMessage]:
        """The messages no run took in, oldest first."""
        return [m for m in self.messages if not m.taken]


def replay(events: Sequence[StoredEvent]) -> Replay:
    """Fold a session's events (in seq order) into a :class:`Replay`."""
    fold = _Fold()
    for e in events:
        step = _STEPS.get(e.kind)
        if step is not None:
            step(fold, e)
    return fold.replay(last_seq=events[-1].seq if events else 0)


class _Fold:
    """What :func:`replay` carries from one event to the next: one method per event kind."""

    def __init__(self) -> None:
        self.transcript: list[Message] = []
        self.messages: list[ReceivedMessage] = []
        self.by_id: dict[str, ReceivedMessage] = {}
        self.legacy: list[ReceivedMessage] = []  # messages of a log written before ids: by text
        self.run_open = False
        self.submit: dict[str, Any] | None = None
        self.last_result: dict[str, Any] | None = None
        self.spent = Spend()
        self.reported: set[str] = set()
        self.untold: set[str] = set()
        self.asked: dict[str, dict[str, Any]] = {}  # call id → request payload, while unanswered
        self.requests: dict[str, dict[str, Any]] = {}
        self.untold_asks: dict[str, dict[str, Any]] = {}
        self.embedding_calls = 0  # started embed/search calls, less those the budget refused
        self.network_bytes = 0

    def on_transcript(self, e: StoredEvent) -> None:
        p = e.payload
        start = int(p["start"])
        self.transcript = self.transcript[:start] + [message_from_json(m) for m in p["messages"]]
        if self.untold or self.untold_asks:
            text = json.dumps(p["messages"])
            self.untold -= {cid for cid in self.untold if _mention(cid) in text}
            for cid in [c for c in self.untold_asks if _mention_approval(c) in text]:
                del self.untold_asks[cid]
        for mid in p.get("taken") or ():
            if (m := self.by_id.get(str(mid))) is not None:
                m.taken = True
                # a run took it in and has not ended yet (the journal writes a run's
                # transcript before its SessionEnded): a message that came while the
                # previous run was ending is taken in by a new run after that end
                self.run_open = True

    def on_message(self, e: StoredEvent) -> None:
        p = e.payload
        self.run_open = True
        if "id" not in p and p.get("resumed"):
            return  # an old-style re-send of a message already counted
        m = ReceivedMessage(id=str(p.get("id") or f"seq-{e.seq}"), text=str(p["text"]), seq=e.seq)
        self.messages.append(m)
        self.by_id[m.id] = m
        if "id" not in p:
            self.legacy.append(m)

    def on_submit(self, e: StoredEvent) -> None:
        self.submit = {"output": e.payload.get("output")}

    def on_run_ended(self, e: StoredEvent) -> None:
        self.run_open = False
        self.submit = None
        self.last_result = e.payload.get("result")
        for m in self.messages:
            m.answered = m.answered or m.taken

    def on_usage(self, e: StoredEvent) -> None:
        self.spent = _spend_from(e.payload)

    def on_host_call(self, e: StoredEvent) -> None:
        if e.payload.get("name") in EMBEDDING_FUNCTIONS:
            self.embedding_calls += 1

    def on_connection(self, e: StoredEvent) -> None:
        p = e.payload
        self.network_bytes += int(p.get("bytes_sent", 0)) + int(p.get("bytes_received", 0))

    def on_budget_warning(self, e: StoredEvent) -> None:
        if e.payload.get("limit") == "embedding_calls":
            self.embedding_calls -= 1  # the call it refused was never counted

    def on_approval_requested(self, e: StoredEvent) -> None:
        p = e.payload
        self.asked[str(p["call_id"])] = self.requests[str(p["call_id"])] = p

    def on_approval_answered(self, e: StoredEvent) -> None:
        p = e.payload
        cid = str(p["call_id"])
        self.asked.pop(cid, None)
        if p.get("reason") == RESTART_DENIAL and cid in self.requests:
            self.untold_asks[cid] = self.requests[cid]

    def on_unknown_outcome(self, e: StoredEvent) -> None:
        self.reported.add(str(e.payload["call_id"]))
        self.untold.add(str(e.payload["call_id"]))

    def replay(self, *, last_seq: int) -> Replay:
        """The fold's result, once every event is in (legacy messages matched by text)."""
        _match_legacy(self.transcript, self.legacy)
        return Replay(
            transcript=self.transcript,
            messages=self.messages,
            run_open=self.run_open,
            submit=self.submit,
            last_result=self.last_result,
            last_seq=last_seq,
            spent=dataclasses.replace(
                self.spent,
                embedding_calls=max(0, self.embedding_calls),
                network_bytes=self.network_bytes,
            ),
            reported_unknown=frozenset(self.reported),
            untold_unknown=frozenset(self.untold),
            waiting_approvals=tuple(self.asked.values()),
            untold_approvals=tuple(self.untold_asks.values()),
        )


_STEPS: dict[str, Callable[[_Fold, StoredEvent], None]] = {
    TRANSCRIPT: _Fold.on_transcript,
    MESSAGE_RECEIVED: _Fold.on_message,
    SUBMIT_ACCEPTED: _Fold.on_submit,
    RUN_ENDED: _Fold.on_run_ended,
    USAGE_UPDATED: _Fold.on_usage,
    HOST_CALL_STARTED: _Fold.on_host_call,
    NETWORK_CONNECTION: _Fold.on_connection,
    BUDGET_WARNING: _Fold.on_budget_warning,
    APPROVAL_REQUESTED: _Fold.on_approval_requested,
    APPROVAL_ANSWERED: _Fold.on_approval_answered,
    CALL_OUTCOME_UNKNOWN: _Fold.on_unknown_outcome,
}
"""What :func:`replay` does with each kind of event (other kinds change nothing)."""


def unreported_unknown(state: Replay, calls: Sequence[CallRecord]) -> list[CallRecord]:
    """The calls a resume must report unknown: no outcome, or ``unknown`` but never reported.

    A call without an outcome was running when its process died. A call already marked
    ``unknown`` whose ``CallOutcomeUnknown`` is not in the log was marked by a resume killed
    before it appended the event (or by a cancel: its process stopped while it ran); reporting
    it now keeps "every unknown call is reported once, and the model told" true.
    """
    return [
        c
        for c in calls
        if c.outcome is None or (c.outcome == "unknown" and c.call_id not in state.reported_unknown)
    ]


def untold_unknown(state: Replay, calls: Sequence[CallRecord]) -> list[CallRecord]:
    """The calls a resume's note names (the model is to be told their outcome is unknown).

    :func:`unreported_unknown`, and the reported calls no transcript message mentions yet
    (the note that named them was lost in a crash).
    """
    unreported = {c.call_id for c in unreported_unknown(state, calls)}
    return [c for c in calls if c.call_id in unreported or c.call_id in state.untold_unknown]


def _mention(call_id: str) -> str:
    """How :func:`restart_note` names call *call_id* (as it reads inside JSON, too)."""
    return f"(call {call_id}) was running"


def _mention_approval(call_id: str) -> str:
    """How :func:`restart_note` names approval request *call_id*."""
    return f"(approval {call_id}) was waiting"


def _match_legacy(transcript: Sequence[Message], legacy: Sequence[ReceivedMessage]) -> None:
    """Mark id-less messages taken when a transcript user message ends with their text."""
    users = [m.text for m in transcript if isinstance(m, UserMessage)]
    for m in legacy:
        hit = next(
            (i for i, t in enumerate(users) if t == m.text or t.endswith(f"\n\n{m.text}")), None
        )
        if hit is not None:
            m.taken = True
            del users[hit]


def _spend_from(payload: dict[str, Any]) -> Spend:
    """The session totals a ``UsageUpdated`` payload carries (unknown cost counts as unpriced)."""
    fields = {f.name for f in dataclasses.fields(Usage)}
    usage = Usage(**{k: int(v) for k, v in (payload.get("usage") or {}).items() if k in fields})
    cost = payload.get("cost_micro_usd")
    return Spend(
        model_calls=int(payload.get("model_calls", 0)),
        usage=usage,
        cost_micro_usd=int(cost or 0),
        unpriced_calls=0 if cost is not None else 1,
    )


def restart_note(unknown: Sequence[CallRecord], approvals: Sequence[dict[str, Any]] = ()) -> str:
    """What the model is told after a resume: a fresh kernel, nothing re-run, unknown calls.

    *approvals* are the ``ApprovalRequested`` payloads of calls that waited for approval: each
    is named as not run (denied by the restart).
    """
    lines = [
        "[The service restarted] The kernel is new: variables and imports from earlier cells "
        "are gone (inputs and host functions are bound again). No cell was re-run."
    ]
    for c in unknown:
        args = ", ".join(f"{k}={v!r}" for k, v in c.args.items())
        lines.append(
            f"- {c.name}({args}) {_mention(c.call_id)}: its outcome is UNKNOWN. It may "
            "or may not have taken effect; it was not repeated. Check before doing it again."
        )
    for a in approvals:
        args = ", ".join(f"{k}={v!r}" for k, v in dict(a.get("arguments") or {}).items())
        lines.append(
            f"- {a.get('name')}({args}) {_mention_approval(str(a.get('call_id')))} for approval "
            "when the service stopped: it did NOT run (denied by the restart). Call it again "
            "if it is still needed; it will be asked for again."
        )
    return "\n".join(lines)


def answer_dangling(transcript: list[Message], note: str) -> list[Message]:
    """*transcript* with a result for every tool call of the last reply that has none."""
    answered = {m.tool_call_id for m in transcript if isinstance(m, ToolResultMessage)}
    last = next((m for m in reversed(transcript) if isinstance(m, AssistantMessage)), None)
    out = list(transcript)
    if last is None:
        return out
    for call in last.tool_calls:
        if call.id not in answered:
            text = f"not completed: the service stopped while this ran.\n{note}"
            out.append(ToolResultMessage(call.id, text, is_error=True, name=call.name))
    return out


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What a resumed session does, decided by :func:`plan` alone.

    Attributes:
        transcript: the transcript to start from (dangling tool calls answered when a run was
            cut off).
        note: the restart note (:func:`restart_note`).
        end_with: the result JSON the interrupted run ends with before anything else (its own
            ``SessionEnded`` whose record was not written, or its accepted ``submit``); None
            when no run is to be ended.
        sends: ``(message id, text)`` to send in order; the first carries the note. A None id
            is the note alone (it continues an open run whose messages were all taken).
        preamble: the note for the next message when nothing is sent now (an idle session).
    """

    transcript: list[Message]
    note: str
    end_with: dict[str, Any] | None = None
    sends: list[tuple[str | None, str]] = field(default_factory=list)
    preamble: str | None = None


def plan(
    state: Replay, *, unknown: Sequence[CallRecord], was_running: bool, session_id: str
) -> Plan:
    """Decide what the resumed session does from its :class:`Replay`.

    *unknown* are the calls whose unknown outcome the model is to be told
    (:func:`untold_unknown`), *was_running* whether its record said ``running``. A run the
    log shows ended, or whose ``submit`` was accepted, ends with that result; an open run
    otherwise continues; every message no run took in is sent (once, under its id), starting a
    new run when none is open.
    """
    note = restart_note(unknown, [*state.untold_approvals, *state.waiting_approvals])
    if not was_running:
        pending = state.pending
        return Plan(
            transcript=state.transcript,
            note=note,
            sends=_with_note(note, [(m.id, m.text) for m in pending]),
            preamble=None if pending else note,
        )
    end_with: dict[str, Any] | None = None
    if state.run_open and state.submit is not None:
        end_with = submit_result(state.submit["output"], session_id=session_id)
    elif not state.run_open:
        end_with = state.last_result or {"status": "cancelled", "session_id": session_id}
    sends: list[tuple[str | None, str]] = [(m.id, m.text) for m in state.pending]
    if end_with is None and not sends:
        sends = [(None, note)]
    elif sends:
        sends = _with_note(note, sends)
    return Plan(
        transcript=answer_dangling(state.transcript, note),
        note=note,
        end_with=end_with,
        sends=sends,
        preamble=None if sends else note,
    )


def _with_note(note: str, sends: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
    if not sends:
        return []
    (mid, text), *rest = sends
    return [(mid, f"{note}\n\n{text}"), *rest]


def submit_result(output: Any, *, session_id: str) -> dict[str, Any]:
    """The result JSON of a run that ended with an accepted ``submit`` of *output*.

    The run's usage is not known here (the session's spend is: ``UsageUpdated``).
    """
    return {"status": "success", "output": output, "usage": {}, "cost_micro_usd": None,
            "turns": 0, "model_calls": 0, "sub_calls": 0, "session_id": session_id,
            "error": None}  # fmt: skip
