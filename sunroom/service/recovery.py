"""Rebuilding a session from its log after a crash: :func:`replay` and :func:`restart_note`.

Pure functions over stored events and call records: the transcript (from ``Transcript``
events), the user messages sent (``MessageReceived``), whether a run was in progress, the
messages the transcript had not taken in yet, and the tool calls the crash left unanswered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

from sunroom.agent.budget import Spend
from sunroom.providers import AssistantMessage, Message, ToolResultMessage, Usage, UserMessage
from sunroom.service.codec import message_from_json
from sunroom.service.journal import TRANSCRIPT
from sunroom.store import CallRecord, StoredEvent

__all__ = ["MESSAGE_RECEIVED", "Replay", "answer_dangling", "replay", "restart_note"]

MESSAGE_RECEIVED = "MessageReceived"
"""Kind of the event recording a user message, appended before the session gets it."""

RUN_ENDED = "SessionEnded"
USAGE_UPDATED = "UsageUpdated"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """What a session's log says.

    Attributes:
        transcript: the model transcript as last recorded.
        pending: user messages recorded but not (yet) in the transcript, oldest first.
        run_open: a run was in progress (a message after the last run end).
        last_result: the result of the last ``SessionEnded`` (None when none).
        last_seq: the seq of the last event.
        spent: the session's spend as its last ``UsageUpdated`` event recorded it.
    """

    transcript: list[Message]
    pending: list[str]
    run_open: bool
    last_result: dict[str, Any] | None
    last_seq: int
    spent: Spend = Spend()


def replay(events: Sequence[StoredEvent]) -> Replay:
    """Fold a session's events (in seq order) into a :class:`Replay`."""
    transcript: list[Message] = []
    texts: list[str] = []
    run_open = False
    last_result: dict[str, Any] | None = None
    spent = Spend()
    for e in events:
        if e.kind == TRANSCRIPT:
            start = int(e.payload["start"])
            transcript = transcript[:start] + [message_from_json(m) for m in e.payload["messages"]]
        elif e.kind == MESSAGE_RECEIVED:
            texts.append(str(e.payload["text"]))
            run_open = True
        elif e.kind == RUN_ENDED:
            run_open = False
            last_result = e.payload.get("result")
        elif e.kind == USAGE_UPDATED:
            spent = _spend_from(e.payload)
    return Replay(
        transcript=transcript,
        pending=_unmatched(transcript, texts),
        run_open=run_open,
        last_result=last_result,
        last_seq=events[-1].seq if events else 0,
        spent=spent,
    )


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


def _unmatched(transcript: Sequence[Message], texts: Sequence[str]) -> list[str]:
    """The suffix of *texts* not found, in order, among the transcript's user messages."""
    i = 0
    for m in transcript:
        if i < len(texts) and isinstance(m, UserMessage) and m.text == texts[i]:
            i += 1
    return list(texts[i:])


def restart_note(unknown: Sequence[CallRecord]) -> str:
    """What the model is told after a resume: a fresh kernel, nothing re-run, unknown calls."""
    lines = [
        "[The service restarted] The kernel is new: variables and imports from earlier cells "
        "are gone (inputs and host functions are bound again). No cell was re-run."
    ]
    for c in unknown:
        args = ", ".join(f"{k}={v!r}" for k, v in c.args.items())
        lines.append(
            f"- {c.name}({args}) (call {c.call_id}) was running: its outcome is UNKNOWN. It may "
            "or may not have taken effect; it was not repeated. Check before doing it again."
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
