"""A resume killed after marking a call ``unknown`` but before reporting it: the next reports it.

Found by the crash suite (``test_crash_suite.py``): a resume marks the calls the dead process
left unfinished ``unknown`` in the store, starts a kernel, then appends ``CallOutcomeUnknown``.
A ``kill -9`` in between used to leave the call ``unknown`` with no event, and the next resume
(which looked only for calls without an outcome) neither logged it nor told the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sunroom.providers import ScriptedModel, UserMessage
from sunroom.service import ServiceConfig, SessionManager
from sunroom.service.codec import message_to_json
from sunroom.service.recovery import plan, replay, unreported_unknown, untold_unknown
from sunroom.service.schemas import CreateSession
from sunroom.store import CallOutcome, CallRecord, NewEvent, SQLiteStore, StoredEvent

TOKEN = "test-token-0123456789abcdef"


def test_only_unreported_unknown_calls_are_reported_again() -> None:
    def event(seq: int, call_id: str) -> StoredEvent:
        payload = {"call_id": call_id}
        return StoredEvent(
            session_id="s", seq=seq, kind="CallOutcomeUnknown", payload=payload, ts=0
        )

    def call(call_id: str, outcome: CallOutcome | None) -> CallRecord:
        return CallRecord(session_id="s", call_id=call_id, name="charge", args={},
                          side_effect=True, started_at=0, started_by="dead", outcome=outcome,
                          result=None, finished_at=None)  # fmt: skip

    state = replay([event(1, "1")])
    assert state.reported_unknown == {"1"}
    calls = [call("1", "unknown"), call("2", "unknown"), call("3", None), call("4", "ok")]
    assert [c.call_id for c in unreported_unknown(state, calls)] == ["2", "3"]


async def test_a_call_marked_unknown_without_its_event_is_reported_by_the_next_resume(
    tmp_path: Path,
) -> None:
    config = ServiceConfig(
        token=TOKEN, db_path=tmp_path / "s.db", backend="subprocess", model="fake:x",
        resume_orphans=False, lease_s=5,
    )  # fmt: skip
    async with SQLiteStore(config.db_path) as store:
        request = CreateSession(task="t", model="fake:x").model_dump(mode="json")
        await store.create_session("s", config=request, owner="dead", lease_s=0.01)
        transcript = {"start": 0, "messages": [message_to_json(UserMessage("t"))], "taken": ["m"]}
        await store.append("s", [
            NewEvent(seq=1, kind="MessageReceived", payload={"id": "m", "text": "t"}, ts=0.0),
            NewEvent(seq=2, kind="Transcript", payload=transcript, ts=0.0),
        ], owner="dead")  # fmt: skip
        await store.record_call_started(
            "s", "1", name="charge", args={"amount": 5}, side_effect=True, owner="dead"
        )
        # the killed resume: it marked the call, then died before its CallOutcomeUnknown
        await store.mark_unknown("s", "1", owner="dead")
        await store.release("s", owner="dead")  # as if its lease ran out
        model = ScriptedModel(["done"])
        manager = SessionManager(store, config=config, resolve_model=lambda spec, url: model)
        await manager.start()
        try:
            await manager.resume("s")
            status, result = await manager.result("s", timeout_s=30)
        finally:
            await manager.aclose()
        events = await store.events("s")
        calls = await store.calls("s")
    assert status == "finished" and result["output"] == "done", result
    kinds = [e.kind for e in events]
    assert kinds.count("CallOutcomeUnknown") == 1, kinds
    restarted = next(e for e in events if e.kind == "KernelRestarted")
    assert restarted.payload["unknown_calls"] == ["1"]
    assert [c.outcome for c in calls] == ["unknown"]
    told = json.dumps([m.text for m in replay(events).transcript if isinstance(m, UserMessage)])
    assert "charge(amount=5) (call 1) was running: its outcome is UNKNOWN" in told, told


def _call(call_id: str, outcome: CallOutcome | None) -> CallRecord:
    return CallRecord(session_id="s", call_id=call_id, name="charge", args={"amount": 3},
                      side_effect=True, started_at=0, started_by="dead", outcome=outcome,
                      result=None, finished_at=None)  # fmt: skip


def _submit_then_resumed() -> list[tuple[str, dict[str, Any]]]:
    """A run that submitted, was killed in charge(3) (call 4), and was ended by a resume that
    held its note (naming call 4) in memory for the next message, then was killed too."""
    transcript = {"start": 0, "messages": [message_to_json(UserMessage("t"))], "taken": ["m"]}
    return [
        ("MessageReceived", {"id": "m", "text": "t"}),
        ("Transcript", transcript),
        ("SubmitAccepted", {"output": "s3"}),
        ("CallOutcomeUnknown", {"call_id": "4", "name": "charge", "args": {"amount": 3}}),
        ("KernelRestarted", {"unknown_calls": ["4"]}),
        ("SessionEnded", {"result": {"status": "success", "output": "s3"}}),
    ]


def test_a_reported_call_no_transcript_mentions_is_named_again() -> None:
    events = [
        StoredEvent(session_id="s", seq=i, kind=k, payload=p, ts=0)
        for i, (k, p) in enumerate(_submit_then_resumed(), 1)
    ]
    state = replay(events)
    assert state.untold_unknown == {"4"}
    calls = [_call("4", "unknown")]
    assert unreported_unknown(state, calls) == []  # reported: no second CallOutcomeUnknown
    assert untold_unknown(state, calls) == calls  # but named in the next note
    todo = plan(state, unknown=untold_unknown(state, calls), was_running=False, session_id="s")
    assert todo.preamble is not None and "(call 4) was running" in todo.preamble
    told = {"start": 1, "messages": [message_to_json(UserMessage(todo.preamble))]}
    more = StoredEvent(session_id="s", seq=7, kind="Transcript", payload=told, ts=0)
    assert replay([*events, more]).untold_unknown == set()


async def test_a_note_lost_with_its_process_is_given_by_the_next_resume(tmp_path: Path) -> None:
    # found by the crash suite: the note naming an unknown call was held in memory (the
    # session was idle) and died with its process; the next note did not name the call
    config = ServiceConfig(
        token=TOKEN, db_path=tmp_path / "s.db", backend="subprocess", model="fake:x",
        resume_orphans=False, lease_s=5,
    )  # fmt: skip
    async with SQLiteStore(config.db_path) as store:
        request = CreateSession(task="t", model="fake:x").model_dump(mode="json")
        await store.create_session("s", config=request, owner="dead", lease_s=5)
        steps = _submit_then_resumed()
        new = [NewEvent(seq=i, kind=k, payload=p, ts=0) for i, (k, p) in enumerate(steps, 1)]
        await store.append("s", new, owner="dead")
        await store.record_call_started(
            "s", "4", name="charge", args={"amount": 3}, side_effect=True, owner="dead"
        )
        await store.mark_unknown("s", "4", owner="dead")
        await store.finish_session(
            "s", status="finished", result={"status": "success", "output": "s3"}, owner="dead"
        )
        await store.release("s", owner="dead")
        model = ScriptedModel(["done"])
        manager = SessionManager(store, config=config, resolve_model=lambda spec, url: model)
        await manager.start()
        try:
            await manager.send("s", "next")
            status, result = await manager.result("s", timeout_s=30)
        finally:
            await manager.aclose()
        events = await store.events("s")
    assert status == "finished" and result["output"] == "done", result
    assert [e.kind for e in events].count("CallOutcomeUnknown") == 1
    users = [m.text for m in replay(events).transcript if isinstance(m, UserMessage)]
    assert any("(call 4) was running" in u and u.endswith("next") for u in users), users
