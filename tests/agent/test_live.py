"""Live output of a running cell: CellStarted and OutputChunk, coalesced, bounded, redacted."""

from __future__ import annotations

import asyncio

import pytest

from sunroom.agent import AsyncSession
from sunroom.agent import events as ev
from sunroom.agent.bus import EventBus, Subscription
from sunroom.agent.guard import Guard, context_guard
from sunroom.agent.live import LIVE_OUTPUT_BYTES, LiveOutput
from sunroom.providers import ScriptedModel
from tests.agent.conftest import code, collect

FAST = "subprocess"
SECRET = "sk-live-4f9a8b7c6d5e4f3a2b1c"


class _Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _live(
    *, secret: str | None = None, max_bytes: int = LIVE_OUTPUT_BYTES
) -> tuple[LiveOutput, Subscription, _Clock]:
    bus = EventBus()
    guard: Guard = context_guard({"api_key": secret} if secret else {}, None)

    def publish(cls: type[ev.Event], /, **fields: object) -> ev.Event:
        return bus.publish(cls, **{k: guard.redact_value(v) for k, v in fields.items()})

    clock = _Clock()
    live = LiveOutput(publish=publish, guard=guard, max_bytes=max_bytes, clock=clock)
    return live, bus.subscribe(), clock


def _drain(sub: Subscription) -> list[ev.Event]:
    out = []
    while (e := sub.get_nowait()) is not None:
        out.append(e)
    return out


def _chunks(events: list[ev.Event]) -> list[ev.OutputChunk]:
    return [e for e in events if isinstance(e, ev.OutputChunk)]


async def test_a_tight_print_loop_is_coalesced_and_its_first_write_goes_out_at_once() -> None:
    live, sub, _ = _live()
    live.begin(1, "for i in range(10_000):\n    print(i)")
    live.feed("stdout", "0\n")
    first = _drain(sub)
    assert [type(e) for e in first] == [ev.CellStarted, ev.OutputChunk]
    assert isinstance(first[0], ev.CellStarted) and first[0].lines == 2 and first[0].cell == 1
    for i in range(1, 10_000):
        live.feed("stdout", f"{i}\n")  # all within the window: the clock does not move
    assert _drain(sub) == []
    live.end()
    rest = _chunks(_drain(sub))
    assert len(rest) == 1
    text = "".join(c.text for c in _chunks(first) + rest)
    assert text == "".join(f"{i}\n" for i in range(10_000))


async def test_held_writes_go_out_when_the_window_passes_without_the_cell_ending() -> None:
    bus = EventBus()
    guard = context_guard((), None)

    def publish(cls: type[ev.Event], /, **fields: object) -> ev.Event:
        return bus.publish(cls, **fields)

    live = LiveOutput(publish=publish, guard=guard, window_s=0.01)
    sub = bus.subscribe()
    live.begin(1, "print('a'); print('b')")
    live.feed("stdout", "a\n")
    live.feed("stdout", "b\n")  # inside the window: held, then sent by the timer
    got: list[str] = []
    while len(got) < 2:
        event = await asyncio.wait_for(anext(sub), 30)  # a bound for a failure, not a timing
        if isinstance(event, ev.OutputChunk):
            got.append(event.text)
    assert got == ["a\n", "b\n"]
    live.end()


async def test_streamed_bytes_are_capped_per_cell_with_one_marker_saying_how_many_dropped() -> None:
    live, sub, clock = _live(max_bytes=100)
    live.begin(1, "print('x' * 1000)")
    for _ in range(10):
        clock.now += 1
        live.feed("stdout", "é" * 50)  # 100 bytes each: the cap cuts between characters
    live.end()
    chunks = _chunks(_drain(sub))
    *streamed, marker = chunks
    assert "".join(c.text for c in streamed) == "é" * 50
    assert all(c.dropped_bytes == 0 for c in streamed)
    assert marker.dropped_bytes == 900 and "900" in marker.text
    live.begin(1, "print('again')")  # the cap is per cell
    live.feed("stdout", "again\n")
    live.end()
    again = _chunks(_drain(sub))
    assert [c.text for c in again] == ["again\n"] and again[0].cell == 2


async def test_a_secret_split_across_writes_never_shows_a_fragment() -> None:
    live, sub, clock = _live(secret=SECRET)
    live.begin(1, "print(key)")
    text = f"key: {SECRET} and again {SECRET}\ndone\n"
    for i in range(len(text)):  # one character a write, each past the window: a flush each
        clock.now += 1
        live.feed("stdout", text[i])
    live.end()
    chunks = _chunks(_drain(sub))
    assert len(chunks) > 10  # streamed piece by piece, not held to the end
    joined = "".join(c.text for c in chunks)
    assert joined == "key: [REDACTED:api_key] and again [REDACTED:api_key]\ndone\n"
    for c in chunks:
        assert SECRET[:6] not in c.text and "4f9a" not in c.text


async def test_streams_keep_their_order_and_output_between_cells_is_not_published() -> None:
    live, sub, _ = _live()
    live.feed("stdout", "before any cell\n")
    live.begin(1, "...")
    live.feed("stdout", "out 1\n")
    live.feed("stderr", "err 1\n")
    live.feed("stdout", "out 2\n")
    live.end()
    live.feed("stdout", "between cells\n")
    chunks = _chunks(_drain(sub))
    assert [(c.stream, c.text) for c in chunks] == [
        ("stdout", "out 1\n"),
        ("stderr", "err 1\n"),
        ("stdout", "out 2\n"),
    ]


@pytest.mark.kernel
async def test_a_running_cells_output_arrives_before_it_ends_and_never_shows_a_secret() -> None:
    release = asyncio.Event()

    async def wait_for_host() -> None:
        """Returns when the host lets the cell go on."""
        await release.wait()

    cell = (
        "print('first line', flush=True)\n"
        "wait_for_host()\n"
        f"key = ''.join([{SECRET[:10]!r}, {SECRET[10:]!r}])\n"
        "print('key:', key[:10], end='', flush=True)\n"
        "print(key[10:])\n"
        "print('last line')\n"
    )
    async with AsyncSession(
        model=ScriptedModel([code(cell), "done"]),
        backend=FAST,
        functions=[wait_for_host],
        secrets={"api_key": SECRET},
    ) as s:
        sub = s.events()
        task = asyncio.create_task(s.run("go"))
        seen: list[ev.Event] = []
        while True:  # the cell waits for release: this chunk can only be live output
            event = await asyncio.wait_for(anext(sub), 120)
            seen.append(event)
            assert not isinstance(event, ev.ExecutionFinished)
            if isinstance(event, ev.OutputChunk) and "first line" in event.text:
                break
        release.set()
        result = await task
        seen += await collect(sub)
    assert result.ok
    kinds = [type(e) for e in seen]
    assert kinds.index(ev.CodeSubmitted) < kinds.index(ev.CellStarted)
    assert kinds.index(ev.CellStarted) < kinds.index(ev.OutputChunk)
    chunks = _chunks(seen)
    assert all(kinds.index(ev.ExecutionFinished) > seen.index(c) for c in chunks)
    streamed = "".join(c.text for c in chunks)
    assert streamed == "first line\nkey: [REDACTED:api_key]\nlast line\n"
    assert all(SECRET[:10] not in c.text and SECRET[10:] not in c.text for c in chunks)
