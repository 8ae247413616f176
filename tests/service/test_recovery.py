from __future__ import annotations

import pytest

from sunroom.agent.budget import Budget, BudgetTracker, Spend
from sunroom.errors import BudgetExceededError
from sunroom.providers import Usage, UserMessage
from sunroom.service.codec import message_to_json
from sunroom.service.recovery import plan, replay
from sunroom.store import StoredEvent


def _event(seq: int, kind: str, payload: dict[str, object]) -> StoredEvent:
    return StoredEvent(session_id="s", seq=seq, kind=kind, payload=payload, ts=0.0)


def test_replay_recovers_the_spend_from_the_last_usage_event() -> None:
    usage = {"input_tokens": 120, "output_tokens": 30}
    events = [
        _event(1, "UsageUpdated", {"usage": {"input_tokens": 10}, "model_calls": 1,
                                   "cost_micro_usd": 5, "sub_call": False}),
        _event(2, "UsageUpdated", {"usage": usage, "model_calls": 4, "cost_micro_usd": 70,
                                   "sub_call": True}),
    ]  # fmt: skip
    spent = replay(events).spent
    assert spent == Spend(
        model_calls=4, usage=Usage(input_tokens=120, output_tokens=30), cost_micro_usd=70
    )
    assert replay([]).spent == Spend()
    unknown = replay([_event(1, "UsageUpdated", {"usage": {}, "model_calls": 2,
                                                 "cost_micro_usd": None, "sub_call": False})])  # fmt: skip
    assert not unknown.spent.cost_known


def test_replay_counts_embedding_calls_and_network_bytes_so_a_resume_keeps_their_budget() -> None:
    events = [
        _event(1, "HostCallStarted", {"call_id": 1, "name": "embed"}),
        _event(2, "HostCallStarted", {"call_id": 2, "name": "lookup"}),  # not an embedding
        _event(3, "UsageUpdated", {"usage": {}, "model_calls": 1, "cost_micro_usd": 0,
                                   "sub_call": False}),  # carries no embedding count
        _event(4, "HostCallStarted", {"call_id": 3, "name": "search"}),
        _event(5, "HostCallStarted", {"call_id": 4, "name": "embed"}),
        _event(6, "BudgetWarning", {"limit": "embedding_calls", "message": "spent"}),
        _event(7, "NetworkConnection", {"host": "pypi.org", "port": 443, "scheme": "https",
                                        "allowed": True, "reason": None, "bytes_sent": 300,
                                        "bytes_received": 9000, "duration_s": 0.1}),
        _event(8, "NetworkConnection", {"host": "x.org", "port": 443, "scheme": "https",
                                        "allowed": False, "reason": "not in allowlist",
                                        "bytes_sent": 0, "bytes_received": 0, "duration_s": 0}),
    ]  # fmt: skip
    spent = replay(events).spent
    assert spent.embedding_calls == 2 and spent.model_calls == 1
    assert spent.network_bytes == 9300
    tracker = BudgetTracker(Budget(max_embedding_calls=2), spent=spent)
    with pytest.raises(BudgetExceededError, match="2 embedding calls is spent"):
        tracker.count_embedding_call()
    assert (
        BudgetTracker(Budget(max_embedding_calls=3), spent=spent)
        .count_embedding_call()
        .embedding_calls
        == 3
    )


def _transcript(seq: int, start: int, texts: list[str], taken: list[str]) -> StoredEvent:
    messages = [message_to_json(UserMessage(t)) for t in texts]
    return _event(seq, "Transcript", {"start": start, "messages": messages, "taken": taken})


def test_messages_are_matched_by_id_not_by_text() -> None:
    # the task was re-sent after a crash with the restart note in front: still one message
    events = [
        _event(1, "MessageReceived", {"id": "a", "text": "task"}),
        _event(2, "KernelRestarted", {}),
        _transcript(3, 0, ["[The service restarted] ...\n\ntask"], ["a"]),
        _event(4, "MessageReceived", {"id": "b", "text": "more"}),
    ]
    state = replay(events)
    assert [(m.id, m.taken) for m in state.messages] == [("a", True), ("b", False)]
    todo = plan(state, unknown=[], was_running=True, session_id="s")
    assert todo.end_with is None
    assert [mid for mid, _ in todo.sends] == ["b"]  # only the untaken one, once
    assert todo.sends[0][1].startswith("[The service restarted]")


def test_an_open_run_with_nothing_pending_continues_with_the_note_alone() -> None:
    events = [
        _event(1, "MessageReceived", {"id": "a", "text": "t"}),
        _transcript(2, 0, ["t"], ["a"]),
    ]
    todo = plan(replay(events), unknown=[], was_running=True, session_id="s")
    assert [mid for mid, _ in todo.sends] == [None] and todo.end_with is None


def test_an_accepted_submit_ends_the_resumed_run() -> None:
    events = [
        _event(1, "MessageReceived", {"id": "a", "text": "t"}),
        _transcript(2, 0, ["t"], ["a"]),
        _event(3, "SubmitAccepted", {"output": {"x": 1}}),
    ]
    todo = plan(replay(events), unknown=[], was_running=True, session_id="s")
    assert todo.end_with is not None and todo.end_with["output"] == {"x": 1}
    assert todo.end_with["status"] == "success" and todo.sends == []
    ended = [*events, _event(4, "SessionEnded", {"result": {"status": "success"}})]
    assert replay(ended).submit is None  # a later run does not inherit it


def test_a_message_the_ended_run_never_took_is_sent_after_a_restart() -> None:
    events = [
        _event(1, "MessageReceived", {"id": "a", "text": "t"}),
        _transcript(2, 0, ["t"], ["a"]),
        _event(3, "MessageReceived", {"id": "b", "text": "late"}),
        _event(4, "SessionEnded", {"result": {"status": "success"}}),
    ]
    todo = plan(replay(events), unknown=[], was_running=True, session_id="s")
    assert todo.end_with == {"status": "success"}
    assert [mid for mid, _ in todo.sends] == ["b"]


def test_a_log_without_message_ids_is_matched_by_text() -> None:
    events = [
        _event(1, "MessageReceived", {"text": "task"}),
        _event(2, "MessageReceived", {"text": "note\n\ntask", "resumed": True}),
        _transcript(3, 0, ["note\n\ntask"], []),
    ]
    state = replay(events)
    assert len(state.messages) == 1 and state.pending == []


def test_a_late_message_taken_after_the_run_ended_opens_a_run() -> None:
    # found by the crash suite: "b" came while the run was ending; the service started a new
    # run that took it in (its Transcript follows the SessionEnded), then the server was killed.
    # The resume ended that open run with the old result, so "b" was taken but never answered.
    events = [
        _event(1, "MessageReceived", {"id": "a", "text": "t"}),
        _transcript(2, 0, ["t"], ["a"]),
        _event(3, "MessageReceived", {"id": "b", "text": "late"}),
        _event(4, "SessionEnded", {"result": {"status": "success", "output": "s3"}}),
        _transcript(5, 1, ["late", "note"], ["b"]),
    ]
    state = replay(events)
    assert state.run_open and state.pending == []
    todo = plan(state, unknown=[], was_running=True, session_id="s")
    assert todo.end_with is None  # the open run continues (with the note) and answers "b"
    assert [mid for mid, _ in todo.sends] == [None]
    ended = [*events, _event(6, "SessionEnded", {"result": {"status": "success"}})]
    assert all(m.taken and m.answered for m in replay(ended).messages)
