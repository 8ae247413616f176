"""Run records: create, read, list, finish, reopen, orphans; bad arguments."""

from __future__ import annotations

import pytest

from sunroom.errors import ClosedError, UsageError
from sunroom.store import EventStore, StoreConflictError, StoreNotFoundError
from tests.store.conftest import T0, FakeClock, OpenStore


async def test_create_and_get(store: EventStore, clock: FakeClock) -> None:
    config = {"model": "scripted", "preset": "rlm", "limits": {"turns": 5}}
    created = await store.create_session("s1", config=config)
    assert created.session_id == "s1"
    assert created.status == "running"
    assert created.config == config
    assert created.result is None
    assert created.created_at == created.updated_at == T0
    assert created.finished_at is None
    assert created.owner is None and created.lease_expires_at is None
    assert await store.get_session("s1") == created
    assert await store.get_session("nope") is None
    assert await store.last_seq("s1") == 0


async def test_returned_dicts_are_copies(store: EventStore) -> None:
    config = {"model": "m"}
    record = await store.create_session("s1", config=config)
    config["model"] = "changed"
    record.config["model"] = "changed too"
    again = await store.get_session("s1")
    assert again is not None and again.config == {"model": "m"}


async def test_create_claimed_and_explicit_created_at(store: EventStore) -> None:
    record = await store.create_session("s1", config={}, created_at=T0 - 50, owner="me", lease_s=30)
    assert record.created_at == T0 - 50
    assert record.owner == "me" and record.lease_expires_at == T0 + 30


async def test_duplicate_id_is_a_conflict(store: EventStore) -> None:
    await store.create_session("s1", config={"a": 1})
    with pytest.raises(StoreConflictError) as info:
        await store.create_session("s1", config={"a": 2})
    assert info.value.reason == "exists"
    record = await store.get_session("s1")
    assert record is not None and record.config == {"a": 1}


async def test_list_newest_first_by_status_and_limit(store: EventStore, clock: FakeClock) -> None:
    for i in range(5):
        await store.create_session(f"s{i}", config={})
        clock.advance(1)
    await store.finish_session("s1", status="finished", result={"ok": True})
    await store.finish_session("s3", status="failed", result=None)
    assert [r.session_id for r in await store.list_sessions()] == ["s4", "s3", "s2", "s1", "s0"]
    assert [r.session_id for r in await store.list_sessions(limit=2)] == ["s4", "s3"]
    running = await store.list_sessions(status="running")
    assert [r.session_id for r in running] == ["s4", "s2", "s0"]
    assert [r.session_id for r in await store.list_sessions(status="failed")] == ["s3"]
    assert await store.list_sessions(status="cancelled") == []


async def test_finish_and_reopen(store: EventStore, clock: FakeClock) -> None:
    await store.create_session("s1", config={}, owner="me", lease_s=60)
    clock.advance(5)
    done = await store.finish_session("s1", status="finished", result={"output": 42}, owner="me")
    assert done.status == "finished" and done.result == {"output": 42}
    assert done.finished_at == T0 + 5 and done.updated_at == T0 + 5
    assert done.owner == "me", "finishing does not release"
    with pytest.raises(StoreConflictError) as info:  # a run ends once
        await store.finish_session("s1", status="cancelled", result=None, owner="me")
    assert info.value.reason == "finished"
    with pytest.raises(StoreConflictError):
        await store.finish_session("s1", status="failed", result=None)
    record = await store.get_session("s1")
    assert record is not None and record.status == "finished" and record.result == {"output": 42}
    clock.advance(5)
    again = await store.reopen_session("s1", owner="me")
    assert again.status == "running" and again.result is None and again.finished_at is None
    assert (await store.finish_session("s1", status="failed", result=None)).status == "failed"


async def test_finish_checks_the_owner_when_given(store: EventStore) -> None:
    await store.create_session("s1", config={}, owner="me", lease_s=60)
    with pytest.raises(StoreConflictError) as info:
        await store.finish_session("s1", status="failed", result=None, owner="other")
    assert info.value.reason == "not_owner"
    record = await store.get_session("s1")
    assert record is not None and record.status == "running"
    # None is the administrative override (a cancel from a process that does not own it).
    cancelled = await store.finish_session("s1", status="cancelled", result=None)
    assert cancelled.status == "cancelled"
    with pytest.raises(StoreConflictError):
        await store.reopen_session("s1", owner="other")


async def test_unknown_sessions(store: EventStore) -> None:
    with pytest.raises(StoreNotFoundError):
        await store.finish_session("nope", status="finished", result=None)
    with pytest.raises(StoreNotFoundError):
        await store.reopen_session("nope", owner="me")
    with pytest.raises(StoreNotFoundError):
        await store.last_seq("nope")
    assert await store.events("nope") == []
    assert await store.calls("nope") == []
    assert await store.unfinished_calls("nope") == []


async def test_orphaned_sessions(store: EventStore, clock: FakeClock) -> None:
    await store.create_session("unowned", config={})
    clock.advance(1)
    await store.create_session("live", config={}, owner="a", lease_s=100)
    clock.advance(1)
    await store.create_session("dying", config={}, owner="b", lease_s=10)
    clock.advance(1)
    await store.create_session("done", config={})
    await store.finish_session("done", status="finished", result=None)
    assert [r.session_id for r in await store.orphaned_sessions()] == ["unowned"]
    clock.advance(10)
    assert [r.session_id for r in await store.orphaned_sessions()] == ["unowned", "dying"]
    assert [r.session_id for r in await store.orphaned_sessions(limit=1)] == ["unowned"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.create_session("", config={}), "session_id"),
        (lambda s: s.create_session("s", config=[1]), "config must be a JSON object"),
        (lambda s: s.create_session("s", config={"x": float("nan")}), "not JSON"),
        (lambda s: s.create_session("s", config={"x": object()}), "not JSON"),
        (lambda s: s.create_session("s", config={}, owner="me"), "owner and lease_s"),
        (lambda s: s.create_session("s", config={}, owner="me", lease_s=0), "lease_s"),
        (lambda s: s.list_sessions(status="bogus"), "status"),
        (lambda s: s.list_sessions(limit=0), "limit"),
        (lambda s: s.finish_session("s", status="running", result=None), "reopen_session"),
        (lambda s: s.finish_session("s", status="done", result=None), "status"),
        (lambda s: s.claim("s", owner="", lease_s=1), "owner"),
        (lambda s: s.claim("s", owner="me", lease_s=float("inf")), "lease_s"),
        (lambda s: s.events("s", after_seq=-1), "after_seq"),
        (lambda s: s.purge(older_than_s=-1), "older_than_s"),
    ],
)
async def test_bad_arguments_are_usage_errors(
    store: EventStore, call: object, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        await call(store)  # type: ignore[operator]
    assert await store.list_sessions() == [], "nothing was written"


async def test_closed_store_refuses(open_store: OpenStore) -> None:
    store = open_store()
    async with store:
        await store.create_session("s1", config={})
    await store.aclose()  # idempotent
    with pytest.raises(ClosedError):
        await store.get_session("s1")
    async with open_store() as again:
        assert await again.get_session("s1") is not None
