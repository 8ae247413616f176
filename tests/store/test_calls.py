"""Call records: recorded before the call runs, exactly one outcome, unknown after a crash."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sunroom.errors import UsageError
from sunroom.store import EventStore, StoreConflictError, StoreNotFoundError, idempotency_key
from tests.store.conftest import T0, FakeClock


@pytest.fixture
async def owned(store: EventStore) -> EventStore:
    await store.create_session("s1", config={}, owner="me", lease_s=600)
    return store


async def test_start_then_finish_exactly_once(owned: EventStore, clock: FakeClock) -> None:
    started = await owned.record_call_started(
        "s1", "c1", name="charge", args={"amount": 5}, side_effect=True, owner="me"
    )
    assert started.outcome is None and not started.finished and started.result is None
    assert started.name == "charge" and started.args == {"amount": 5} and started.side_effect
    assert started.started_at == T0 and started.started_by == "me"
    with pytest.raises(StoreConflictError) as info:
        await owned.record_call_started(
            "s1", "c1", name="charge", args={"amount": 5}, side_effect=True, owner="me"
        )
    assert info.value.reason == "exists"
    clock.advance(2)
    finished = await owned.record_call_finished(
        "s1", "c1", outcome="ok", result={"receipt": "r-1"}, owner="me"
    )
    assert finished.outcome == "ok" and finished.finished
    assert finished.result == {"receipt": "r-1"} and finished.finished_at == T0 + 2
    with pytest.raises(StoreConflictError) as info:
        await owned.record_call_finished(
            "s1", "c1", outcome="error", result={"error": "late"}, owner="me"
        )
    assert info.value.reason == "finished"
    with pytest.raises(StoreConflictError):
        await owned.mark_unknown("s1", "c1", owner="me")
    assert await owned.get_call("s1", "c1") == finished


async def test_finishing_a_call_never_started(owned: EventStore) -> None:
    with pytest.raises(StoreConflictError) as info:
        await owned.record_call_finished("s1", "ghost", outcome="ok", result={}, owner="me")
    assert info.value.reason == "not_started"
    with pytest.raises(StoreConflictError):
        await owned.mark_unknown("s1", "ghost", owner="me")
    assert await owned.get_call("s1", "ghost") is None


async def test_wrong_owner_and_unknown_session(owned: EventStore) -> None:
    with pytest.raises(StoreConflictError) as info:
        await owned.record_call_started(
            "s1", "c1", name="f", args={}, side_effect=False, owner="intruder"
        )
    assert info.value.reason == "not_owner"
    assert await owned.calls("s1") == []
    await owned.record_call_started("s1", "c1", name="f", args={}, side_effect=False, owner="me")
    with pytest.raises(StoreConflictError):
        await owned.record_call_finished("s1", "c1", outcome="ok", result={}, owner="intruder")
    with pytest.raises(StoreConflictError):
        await owned.mark_unknown("s1", "c1", owner="intruder")
    assert (await owned.unfinished_calls("s1"))[0].call_id == "c1"
    with pytest.raises(StoreNotFoundError):
        await owned.record_call_started(
            "nope", "c1", name="f", args={}, side_effect=False, owner="me"
        )


async def test_unfinished_calls_and_mark_unknown(owned: EventStore, clock: FakeClock) -> None:
    for n, side_effect in enumerate([False, True, True, False]):
        clock.advance(1)
        await owned.record_call_started(
            "s1", f"c{n}", name="f", args={"n": n}, side_effect=side_effect, owner="me"
        )
    await owned.record_call_finished("s1", "c0", outcome="ok", result={"v": 0}, owner="me")
    await owned.record_call_finished("s1", "c2", outcome="error", result={"e": "x"}, owner="me")
    assert [c.call_id for c in await owned.unfinished_calls("s1")] == ["c1", "c3"]
    # After a crash, the new owner reports these as unknown; they are never replayed.
    assert await owned.claim("s1", owner="me", lease_s=60)
    unknown = await owned.mark_unknown("s1", "c1", owner="me")
    assert unknown.outcome == "unknown" and unknown.result is None and unknown.finished
    with pytest.raises(StoreConflictError) as info:
        await owned.mark_unknown("s1", "c1", owner="me")
    assert info.value.reason == "finished"
    assert [c.call_id for c in await owned.unfinished_calls("s1")] == ["c3"]
    assert [(c.call_id, c.outcome) for c in await owned.calls("s1")] == [
        ("c0", "ok"),
        ("c1", "unknown"),
        ("c2", "error"),
        ("c3", None),
    ]


async def test_call_ids_are_per_session(owned: EventStore) -> None:
    await owned.create_session("s2", config={}, owner="me", lease_s=600)
    for sid in ("s1", "s2"):
        await owned.record_call_started(sid, "c1", name="f", args={}, side_effect=False, owner="me")
    assert [c.session_id for c in await owned.calls("s2")] == ["s2"]


async def test_bad_call_arguments(owned: EventStore) -> None:
    with pytest.raises(UsageError, match="outcome"):
        # "unknown" is recorded by mark_unknown only
        await owned.record_call_finished("s1", "c1", outcome="unknown", result={}, owner="me")
    with pytest.raises(UsageError, match="side_effect"):
        await owned.record_call_started("s1", "c1", name="f", args={}, side_effect=1, owner="me")  # type: ignore[arg-type]
    bad_args: Any = None
    with pytest.raises(UsageError, match="args"):
        await owned.record_call_started(
            "s1", "c1", name="f", args=bad_args, side_effect=False, owner="me"
        )
    assert await owned.calls("s1") == []


def test_idempotency_key_is_stable_and_distinct() -> None:
    key = idempotency_key("session-1", "call-7")
    # A fixed vector: this value must never change (remote APIs may hold keys for days).
    assert key == str(
        uuid.uuid5(
            uuid.uuid5(uuid.NAMESPACE_URL, "sunroom:idempotency-key:v1"), '["session-1", "call-7"]'
        )
    )
    assert key == "b78d3bd8-cd4d-5aef-8f3e-9fea1fce9f11"
    assert uuid.UUID(key).version == 5 and len(key) == 36
    assert idempotency_key("session-1", "call-7") == key
    assert idempotency_key("session-1", "call-8") != key
    assert idempotency_key("a", "bc") != idempotency_key("ab", "c")
    with pytest.raises(UsageError):
        idempotency_key("", "c")


async def test_call_record_carries_its_key(owned: EventStore) -> None:
    record = await owned.record_call_started(
        "s1", "c1", name="f", args={}, side_effect=True, owner="me"
    )
    assert record.idempotency_key == idempotency_key("s1", "c1")
