"""Single writer per session: claim, renew, release, lease expiry (with an injected clock)."""

from __future__ import annotations

import asyncio

import pytest

from sunroom.store import EventStore, StoreConflictError, StoreNotFoundError
from tests.store.conftest import T0, FakeClock, OpenStore, batch


async def test_claim_an_unowned_session(store: EventStore) -> None:
    await store.create_session("s1", config={})
    assert await store.claim("s1", owner="a", lease_s=30)
    record = await store.get_session("s1")
    assert record is not None and record.owner == "a" and record.lease_expires_at == T0 + 30
    assert not await store.claim("s1", owner="b", lease_s=30)
    record = await store.get_session("s1")
    assert record is not None and record.owner == "a"


async def test_claiming_again_extends_ones_own_lease(store: EventStore, clock: FakeClock) -> None:
    await store.create_session("s1", config={}, owner="a", lease_s=30)
    clock.advance(20)
    assert await store.claim("s1", owner="a", lease_s=30)
    record = await store.get_session("s1")
    assert record is not None and record.lease_expires_at == T0 + 50


async def test_lease_expiry_lets_another_owner_claim(store: EventStore, clock: FakeClock) -> None:
    await store.create_session("s1", config={}, owner="a", lease_s=30)
    await store.append("s1", batch(1, 3), owner="a")
    clock.advance(29.999)
    assert not await store.claim("s1", owner="b", lease_s=30)
    clock.advance(0.001)  # the lease ends at exactly T0 + 30
    assert await store.claim("s1", owner="b", lease_s=30)
    # The old owner is fenced off from then on: its writes are refused, nothing is written.
    with pytest.raises(StoreConflictError) as info:
        await store.append("s1", batch(4, 1), owner="a")
    assert info.value.reason == "not_owner"
    assert not await store.renew("s1", owner="a", lease_s=30)
    assert not await store.release("s1", owner="a")
    assert await store.append("s1", batch(4, 1), owner="b") == 4


async def test_an_expired_owner_writes_until_someone_claims(
    store: EventStore, clock: FakeClock
) -> None:
    await store.create_session("s1", config={}, owner="a", lease_s=1)
    clock.advance(10)
    assert await store.append("s1", batch(1, 1), owner="a") == 1
    assert await store.renew("s1", owner="a", lease_s=5)
    record = await store.get_session("s1")
    assert record is not None and record.lease_expires_at == T0 + 15


async def test_renew_and_release(store: EventStore, clock: FakeClock) -> None:
    await store.create_session("s1", config={}, owner="a", lease_s=10)
    clock.advance(5)
    assert await store.renew("s1", owner="a", lease_s=10)
    clock.advance(9)
    assert not await store.claim("s1", owner="b", lease_s=10), "renewed until T0 + 15"
    assert not await store.release("s1", owner="b")
    assert await store.release("s1", owner="a")
    record = await store.get_session("s1")
    assert record is not None and record.owner is None and record.lease_expires_at is None
    assert not await store.renew("s1", owner="a", lease_s=10), "released: renew does not reclaim"
    assert await store.claim("s1", owner="b", lease_s=10)


async def test_ownership_of_unknown_sessions(store: EventStore) -> None:
    for call in (
        store.claim("nope", owner="a", lease_s=1),
        store.renew("nope", owner="a", lease_s=1),
        store.release("nope", owner="a"),
    ):
        with pytest.raises(StoreNotFoundError):
            await call


async def test_concurrent_claims_through_separate_handles_have_one_winner(
    open_store: OpenStore,
) -> None:
    async with open_store() as setup:
        for i in range(20):
            await setup.create_session(f"s{i}", config={})
    handles = [open_store() for _ in range(4)]
    for handle in handles:
        await handle.__aenter__()
    try:
        for i in range(20):
            won = await asyncio.gather(
                *(h.claim(f"s{i}", owner=f"o{n}", lease_s=60) for n, h in enumerate(handles))
            )
            assert sum(won) == 1, won
            record = await handles[0].get_session(f"s{i}")
            assert record is not None and record.owner == f"o{won.index(True)}"
    finally:
        for handle in handles:
            await handle.aclose()
