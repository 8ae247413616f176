from __future__ import annotations

from sunroom.agent.budget import Spend
from sunroom.providers import Usage
from sunroom.service.recovery import replay
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
