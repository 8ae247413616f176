"""The append-only event log: appends, reads, refusals, concurrent readers, throughput."""

from __future__ import annotations

import asyncio
import time

import pytest

from sunroom.errors import UsageError
from sunroom.store import EventStore, NewEvent, StoreConflictError, StoreNotFoundError
from tests.store.conftest import T0, OpenStore, batch


@pytest.fixture
async def owned(store: EventStore) -> EventStore:
    await store.create_session("s1", config={}, owner="me", lease_s=600)
    return store


async def test_append_and_read(owned: EventStore) -> None:
    assert await owned.append("s1", batch(1, 3), owner="me") == 3
    assert await owned.append("s1", batch(4, 2, kind="code", code="print(1)"), owner="me") == 5
    assert await owned.last_seq("s1") == 5
    events = await owned.events("s1")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.kind for e in events] == ["text"] * 3 + ["code"] * 2
    assert events[3].payload == {"n": 4, "code": "print(1)"}
    assert events[0].ts == T0 + 1 and events[0].session_id == "s1"
    assert [e.seq for e in await owned.events("s1", after_seq=3)] == [4, 5]
    assert [e.seq for e in await owned.events("s1", after_seq=1, limit=2)] == [2, 3]
    assert await owned.events("s1", after_seq=5) == []


async def test_payloads_round_trip(owned: EventStore) -> None:
    payload = {
        "text": "héllo \u2603 \x00 line\nbreak",
        "nested": {"list": [1, 2.5, None, True, "x"], "empty": {}},
        "big": 2**62,
        "surrogate": "\ud800 lone",
    }
    await owned.append("s1", [NewEvent(seq=1, kind="k", payload=payload, ts=1.5)], owner="me")
    (event,) = await owned.events("s1")
    assert event.payload == payload and event.ts == 1.5


async def test_empty_append_writes_nothing(owned: EventStore) -> None:
    await owned.append("s1", batch(1, 2), owner="me")
    assert await owned.append("s1", [], owner="me") == 2


@pytest.mark.parametrize(
    ("seqs", "why"),
    [
        ([5, 6], "a gap"),
        ([3, 4], "a duplicate of the last"),
        ([1], "a duplicate of the first"),
        ([3], "a duplicate"),
        ([4, 4], "a duplicate within the batch"),
        ([4, 6], "a gap within the batch"),
        ([5, 4], "out of order"),
    ],
)
async def test_gaps_and_duplicates_are_refused_whole(
    owned: EventStore, seqs: list[int], why: str
) -> None:
    await owned.append("s1", batch(1, 3), owner="me")
    events = [NewEvent(seq=s, kind="x", payload={}, ts=0.0) for s in seqs]
    with pytest.raises(StoreConflictError) as info:
        await owned.append("s1", events, owner="me")
    assert info.value.reason == "seq", why
    assert info.value.last_seq == 3
    assert await owned.last_seq("s1") == 3
    assert [e.kind for e in await owned.events("s1")] == ["text"] * 3


async def test_a_log_starts_at_seq_one(owned: EventStore) -> None:
    with pytest.raises(StoreConflictError):
        await owned.append("s1", batch(2, 1), owner="me")
    assert await owned.last_seq("s1") == 0


async def test_wrong_owner_is_refused(owned: EventStore) -> None:
    with pytest.raises(StoreConflictError) as info:
        await owned.append("s1", batch(1, 1), owner="intruder")
    assert info.value.reason == "not_owner"
    await owned.create_session("unowned", config={})
    with pytest.raises(StoreConflictError):
        await owned.append("unowned", batch(1, 1), owner="me")
    assert await owned.events("s1") == [] and await owned.events("unowned") == []
    with pytest.raises(StoreNotFoundError):
        await owned.append("nope", batch(1, 1), owner="me")


async def test_bad_events_are_refused_and_nothing_written(owned: EventStore) -> None:
    good = NewEvent(seq=1, kind="k", payload={}, ts=0.0)
    for bad, message in [
        (NewEvent(seq=2, kind="k", payload={"x": {1, 2}}, ts=0.0), "payload of event 2"),
        (NewEvent(seq=2, kind="k", payload=[1], ts=0.0), "JSON object"),  # type: ignore[arg-type]
        (NewEvent(seq=2, kind="", payload={}, ts=0.0), "kind"),
        (NewEvent(seq=2, kind="\udcff", payload={}, ts=0.0), "kind is not valid Unicode"),
        (NewEvent(seq=2, kind="k", payload={}, ts=float("nan")), "ts"),
        (NewEvent(seq=0, kind="k", payload={}, ts=0.0), "seq"),
        ({"seq": 2}, "NewEvent"),
    ]:
        with pytest.raises(UsageError, match=message):
            await owned.append("s1", [good, bad], owner="me")  # type: ignore[list-item]
    assert await owned.last_seq("s1") == 0


async def test_racing_appends_of_the_same_seq_one_wins(open_store: OpenStore) -> None:
    async with open_store() as a, open_store() as b:
        await a.create_session("s1", config={}, owner="me", lease_s=600)
        for seq in range(1, 31):
            results = await asyncio.gather(
                a.append("s1", batch(seq, 1, by="a"), owner="me"),
                b.append("s1", batch(seq, 1, by="b"), owner="me"),
                return_exceptions=True,
            )
            assert sorted(type(r).__name__ for r in results) == ["StoreConflictError", "int"]
        events = await a.events("s1")
        assert [e.seq for e in events] == list(range(1, 31))


async def test_concurrent_readers_see_whole_appends_in_order(open_store: OpenStore) -> None:
    batches, size = 150, 7
    total = batches * size
    async with open_store() as writer, open_store() as r1, open_store() as r2:
        await writer.create_session("s1", config={}, owner="w", lease_s=600)
        done = asyncio.Event()

        async def write() -> None:
            for b in range(batches):
                await writer.append("s1", batch(b * size + 1, size), owner="w")
            done.set()

        async def read(reader: EventStore) -> int:
            seen, polls = 0, 0
            while seen < total:
                polls += 1
                got = await reader.events("s1", after_seq=seen, limit=50)
                assert [e.seq for e in got] == list(range(seen + 1, seen + 1 + len(got)))
                assert all(e.payload == {"n": e.seq} for e in got)
                if not got and not done.is_set():
                    await asyncio.sleep(0.001)
                # Appends are atomic: unless cut by the limit, a read ends on a batch boundary.
                if got and len(got) < 50:
                    assert got[-1].seq % size == 0
                seen += len(got)
            return polls

        polls = await asyncio.gather(write(), read(r1), read(r2))
        assert polls[1] > 1 and polls[2] > 1, "the readers ran while the writer wrote"


async def test_append_and_read_throughput(store: EventStore) -> None:
    await store.create_session("s1", config={}, owner="me", lease_s=600)
    start = time.perf_counter()
    for b in range(1000):
        await store.append("s1", batch(b * 10 + 1, 10, text="x" * 80), owner="me")
    appended = time.perf_counter()
    events = await store.events("s1")
    read = time.perf_counter()
    assert len(events) == 10_000 and events[-1].seq == 10_000
    print(
        f"\n10,000 events in batches of 10: append {appended - start:.2f} s"
        f" ({10_000 / (appended - start):,.0f} events/s, {(appended - start):.2f} ms/batch),"
        f" read back {read - appended:.3f} s"
    )
