"""Retention: purge deletes old finished sessions with their events and calls, never running ones."""

from __future__ import annotations

from sunroom.store import EventStore
from tests.store.conftest import T0, FakeClock, batch

DAY = 86_400.0


async def _session(store: EventStore, sid: str, *, status: str | None) -> None:
    await store.create_session(sid, config={}, owner="me", lease_s=1)
    await store.append(sid, batch(1, 3), owner="me")
    await store.record_call_started(sid, "c1", name="f", args={}, side_effect=True, owner="me")
    if status is not None:
        await store.finish_session(sid, status=status, result={"s": status}, owner="me")  # type: ignore[arg-type]
    await store.release(sid, owner="me")


async def test_purge_old_finished_sessions(store: EventStore, clock: FakeClock) -> None:
    for status in ("finished", "failed", "cancelled", "interrupted"):
        await _session(store, f"old-{status}", status=status)
    await _session(store, "old-running", status=None)
    clock.advance(10 * DAY)
    await _session(store, "recent", status="finished")
    await _session(store, "recent-running", status=None)
    clock.advance(DAY)

    assert await store.purge(older_than_s=30 * DAY) == 0
    assert await store.purge(older_than_s=7 * DAY) == 4
    remaining = sorted(r.session_id for r in await store.list_sessions())
    assert remaining == ["old-running", "recent", "recent-running"]
    for gone in ("old-finished", "old-interrupted"):
        assert await store.get_session(gone) is None
        assert await store.events(gone) == []
        assert await store.calls(gone) == []
    assert len(await store.events("recent")) == 3
    assert await store.purge(older_than_s=7 * DAY) == 0

    # Running sessions are never purged, however old.
    assert await store.purge(older_than_s=0, now=T0 + 1000 * DAY) == 1
    assert sorted(r.session_id for r in await store.list_sessions()) == [
        "old-running",
        "recent-running",
    ]


async def test_purge_spares_a_session_still_leased(store: EventStore, clock: FakeClock) -> None:
    await store.create_session("held", config={}, owner="me", lease_s=3 * DAY)
    await store.finish_session("held", status="finished", result=None, owner="me")
    clock.advance(2 * DAY)
    assert await store.purge(older_than_s=DAY) == 0, "its owner still holds it"
    clock.advance(2 * DAY)
    assert await store.purge(older_than_s=DAY) == 1


async def test_purge_many_in_batches(store: EventStore, clock: FakeClock) -> None:
    for i in range(45):
        await store.create_session(f"s{i}", config={})
        await store.finish_session(f"s{i}", status="finished", result=None)
    clock.advance(DAY)
    assert await store.purge(older_than_s=60) == 45
    assert await store.list_sessions() == []
