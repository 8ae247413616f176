"""Seam v2 on every backend: fencing generations, replica heartbeats, kernel placement."""

from __future__ import annotations

import asyncio

import pytest

from sunroom.errors import UsageError
from sunroom.store import EventStore, StoreConflictError, StoreNotFoundError
from tests.store.conftest import T0, FakeClock, OpenStore, batch

# --- fencing generations ---------------------------------------------------------------------


async def test_generation_counts_changes_of_hands(store: EventStore, clock: FakeClock) -> None:
    await store.create_session("free", config={})
    await store.create_session("held", config={}, owner="a", lease_s=10)
    free, held = await store.get_session("free"), await store.get_session("held")
    assert free is not None and free.generation == 0
    assert held is not None and held.generation == 1
    assert await store.claim("held", owner="a", lease_s=10)  # an extension, not a change
    assert await store.renew("held", owner="a", lease_s=10)
    record = await store.get_session("held")
    assert record is not None and record.generation == 1
    clock.advance(11)
    assert await store.claim("held", owner="b", lease_s=10)
    record = await store.get_session("held")
    assert record is not None and record.generation == 2
    assert await store.release("held", owner="b")
    record = await store.get_session("held")
    assert record is not None and record.owner is None and record.generation == 2
    assert await store.claim("held", owner="b", lease_s=10)  # unowned -> owned: a change
    assert await store.claim("free", owner="a", lease_s=10)
    held, free = await store.get_session("held"), await store.get_session("free")
    assert held is not None and held.generation == 3
    assert free is not None and free.generation == 1


async def test_a_stale_generation_is_fenced_even_for_the_same_owner(
    store: EventStore, clock: FakeClock
) -> None:
    """The ABA case: ``a`` loses the session, takes it back, and its old writer is refused."""
    await store.create_session("s", config={}, owner="a", lease_s=10)
    old = 1
    await store.append("s", batch(1, 1), owner="a", generation=old)
    clock.advance(11)
    assert await store.claim("s", owner="b", lease_s=10)
    clock.advance(11)
    assert await store.claim("s", owner="a", lease_s=10)
    record = await store.get_session("s")
    assert record is not None and record.generation == 3
    for write in (
        store.append("s", batch(2, 1), owner="a", generation=old),
        store.record_call_started(
            "s", "c1", name="f", args={}, side_effect=True, owner="a", generation=old
        ),
        store.reopen_session("s", owner="a", generation=old),
        store.finish_session("s", status="finished", result={}, owner="a", generation=old),
    ):
        with pytest.raises(StoreConflictError) as info:
            await write
        assert info.value.reason == "not_owner"
        assert "generation 1" in str(info.value)
    assert not await store.renew("s", owner="a", lease_s=10, generation=old)
    assert not await store.release("s", owner="a", generation=old)
    assert await store.last_seq("s") == 1 and await store.calls("s") == []
    # the current generation writes; without one, the owner check alone applies
    assert await store.append("s", batch(2, 1), owner="a", generation=3) == 2
    await store.record_call_started(
        "s", "c1", name="f", args={}, side_effect=True, owner="a", generation=3
    )
    with pytest.raises(StoreConflictError):
        await store.record_call_finished(
            "s", "c1", outcome="ok", result={}, owner="a", generation=old
        )
    with pytest.raises(StoreConflictError):
        await store.mark_unknown("s", "c1", owner="a", generation=old)
    await store.record_call_finished("s", "c1", outcome="ok", result={}, owner="a", generation=3)
    assert await store.append("s", batch(3, 1), owner="a") == 3
    assert await store.renew("s", owner="a", lease_s=10, generation=3)
    assert await store.release("s", owner="a", generation=3)


async def test_a_bad_generation_is_a_usage_error(store: EventStore) -> None:
    await store.create_session("s", config={}, owner="a", lease_s=10)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(UsageError):
            await store.append("s", batch(1, 1), owner="a", generation=bad)  # type: ignore[arg-type]
    assert await store.last_seq("s") == 0


async def test_racing_claimants_make_one_generation(open_store: OpenStore) -> None:
    async with open_store() as setup:
        await setup.create_session("s", config={})
    stores = [open_store() for _ in range(4)]
    for s in stores:
        await s.__aenter__()
    try:
        wins = await asyncio.gather(
            *(s.claim("s", owner=f"o{i}", lease_s=30) for i, s in enumerate(stores))
        )
        assert wins.count(True) == 1
        record = await stores[0].get_session("s")
        assert record is not None and record.generation == 1
    finally:
        for s in stores:
            await s.aclose()


# --- replicas ---------------------------------------------------------------------------------


async def test_heartbeats_lapse_after_their_time_to_live(
    store: EventStore, clock: FakeClock
) -> None:
    r1 = await store.heartbeat(
        "r1", url="http://127.0.0.1:1", load=3, capacity=10, draining=False, ttl_s=5
    )
    assert (r1.replica_id, r1.url, r1.load, r1.capacity, r1.draining) == (
        "r1",
        "http://127.0.0.1:1",
        3,
        10,
        False,
    )
    assert (r1.heartbeat_at, r1.expires_at) == (T0, T0 + 5)
    await store.heartbeat(
        "r0", url="http://127.0.0.1:2", load=0, capacity=4, draining=True, ttl_s=10
    )
    assert [r.replica_id for r in await store.replicas()] == ["r0", "r1"]
    assert await store.get_replica("r1") == r1
    clock.advance(5)  # r1 lapses at exactly T0 + 5
    assert [r.replica_id for r in await store.replicas()] == ["r0"]
    assert await store.get_replica("r1") is None
    again = await store.heartbeat(
        "r1", url="http://127.0.0.1:3", load=1, capacity=10, draining=True, ttl_s=5
    )
    assert again.url == "http://127.0.0.1:3" and again.draining and again.expires_at == T0 + 10
    assert await store.get_replica("r1") == again
    assert await store.leave("r1")
    assert not await store.leave("r1")
    assert await store.get_replica("r1") is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("url", ""), ("load", -1), ("capacity", -2), ("ttl_s", 0), ("draining", 1)],
)
async def test_bad_heartbeats_are_refused(store: EventStore, field: str, value: object) -> None:
    args: dict[str, object] = {
        "url": "http://127.0.0.1:1",
        "load": 0,
        "capacity": 1,
        "draining": False,
        "ttl_s": 5,
    }
    args[field] = value
    with pytest.raises(UsageError):
        await store.heartbeat("r", **args)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        await store.heartbeat("", url="http://x", load=0, capacity=1, draining=False, ttl_s=1)
    assert await store.replicas() == []


# --- kernel placement -------------------------------------------------------------------------


async def test_kernels_are_placed_once_and_forgotten(store: EventStore, clock: FakeClock) -> None:
    first = await store.place_kernel("k1", replica_id="r1")
    assert (first.kernel_id, first.replica_id, first.created_at) == ("k1", "r1", T0)
    clock.advance(1)
    await store.place_kernel("k2", replica_id="r1")
    await store.place_kernel("k3", replica_id="r2")
    with pytest.raises(StoreConflictError) as info:
        await store.place_kernel("k1", replica_id="r2")
    assert info.value.reason == "exists"
    assert await store.kernel_placement("k1") == first
    assert [k.kernel_id for k in await store.kernels_of("r1")] == ["k1", "k2"]
    assert [k.kernel_id for k in await store.kernels_of("r2")] == ["k3"]
    assert await store.forget_kernel("k1")
    assert not await store.forget_kernel("k1")
    assert await store.kernel_placement("k1") is None
    assert await store.kernels_of("nobody") == []


async def test_generation_writes_name_no_session(store: EventStore) -> None:
    with pytest.raises(StoreNotFoundError):
        await store.append("nope", batch(1, 1), owner="a", generation=1)
    with pytest.raises(StoreNotFoundError):
        await store.renew("nope", owner="a", lease_s=1, generation=1)
