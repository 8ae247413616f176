"""The live view of ``sunroom run``: streamed lines, the elapsed line and fan-out progress."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from sunroom.cli.console import Renderer
from sunroom.store import StoredEvent


class _Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def _events(*items: tuple[str, dict[str, Any]]) -> list[StoredEvent]:
    return [
        StoredEvent(session_id="s", seq=i, kind=kind, payload=payload, ts=0.0)
        for i, (kind, payload) in enumerate(items, 1)
    ]


def _usage(calls: int, tokens: int, cost: int | None, *, sub: bool) -> tuple[str, dict[str, Any]]:
    usage = {"input_tokens": tokens, "output_tokens": 0}
    return "UsageUpdated", {
        "usage": usage, "model_calls": calls, "cost_micro_usd": cost, "sub_call": sub
    }  # fmt: skip


def _fan_out() -> list[StoredEvent]:
    return _events(
        ("CellStarted", {"turn": 1, "cell": 1, "lines": 1}),
        ("OutputChunk", {"turn": 1, "cell": 1, "stream": "stdout", "text": "start"}),
        ("OutputChunk", {"turn": 1, "cell": 1, "stream": "stdout", "text": "ed\n"}),
        _usage(1, 100, 1000, sub=False),
        ("HostCallStarted", {"call_id": 7, "name": "predict_many"}),
        _usage(2, 110, 1200, sub=True),
        ("PredictProgress", {"call_id": 7, "done": 1, "total": 3, "failed": 0}),
        _usage(3, 120, 1400, sub=True),
        ("PredictProgress", {"call_id": 7, "done": 2, "total": 3, "failed": 1}),
        _usage(4, 130, 1600, sub=True),
        ("PredictProgress", {"call_id": 7, "done": 3, "total": 3, "failed": 1}),
        ("OutputChunk", {"turn": 1, "cell": 1, "stream": "stderr", "text": "careful\n"}),
        (
            "ExecutionFinished",
            {
                "turn": 1,
                "status": "ok",
                "output": "started\n[stderr]\ncareful\n3 answers",
                "truncated_chars": 0,
                "truncated_bytes": 0,
                "duration_s": 1.5,
                "state_lost": False,
            },
        ),  # fmt: skip
    )


def test_off_a_terminal_lines_are_plain_and_a_fan_out_is_a_line_per_step() -> None:
    out = io.StringIO()
    renderer = Renderer(Console(file=out, width=100, force_terminal=False), live=True)
    for event in _fan_out():
        renderer.show(event)
    renderer.close()
    lines = out.getvalue().splitlines()
    assert "\x1b[" not in out.getvalue()
    assert lines == [
        "started",
        "· 1 calls · 100 in / 0 out · $0.0010",
        "predict_many 1/3 done · 10 tokens · $0.0002",
        "predict_many 2/3 done · 1 failed · 20 tokens · $0.0004",
        "predict_many 3/3 done · 1 failed · 30 tokens · $0.0006",
        "careful",
        "ok · 1.50s",
        "3 answers",  # the rest of what the model saw; the streamed lines are not repeated
    ]


def test_on_a_terminal_a_footer_shows_the_elapsed_time_and_goes_when_the_cell_ends() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True)
    renderer = Renderer(console, live=True)
    clock = _Clock()
    renderer._footer._clock = clock  # noqa: SLF001  # a clock the test moves
    events = _fan_out()
    for event in events[:3]:
        renderer.show(event)
    clock.now += 2.5
    renderer._footer._update()  # noqa: SLF001  # a redraw, as the refresh thread makes
    assert "▶ cell 1 · turn 1 · running 2.5s" in out.getvalue()
    for event in events[3:]:
        renderer.show(event)
    assert renderer._footer._live is None  # noqa: SLF001
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "predict_many 3/3 done · 1 failed · 30 tokens · $0.0006" in plain
    renderer.close()
