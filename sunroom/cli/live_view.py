"""The live footer of ``sunroom run``: the running cell's elapsed time, ``predict_many`` progress.

:class:`LiveFooter` is fed the stored events the renderer (:mod:`sunroom.cli.console`) shows.
On a terminal it keeps a footer redrawn under the printed log with ``rich.live.Live``: one line
for the running cell (``▶ cell 2 · turn 1 · running 3.4s``) and one per ``predict_many``
fan-out in flight (``n/k done``, failures, the tokens and cost spent since it began). Elsewhere
(a pipe, a file, a test, a replay) nothing is redrawn: a fan-out is a plain progress line
at each tenth of its items, and the cell's duration is in its result's line. While an
approval question waits on the terminal the footer is taken down, so it never draws over the
prompt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final, final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

__all__ = ["LiveFooter", "money"]

_REFRESH_PER_S: Final = 8


def money(micro_usd: int | None) -> str:
    """``$0.0123``, or ``cost unknown``."""
    return "cost unknown" if micro_usd is None else f"${micro_usd / 1_000_000:.4f}"


@dataclass(slots=True)
class _FanOut:
    done: int
    total: int
    failed: int
    tokens_at_start: int
    cost_at_start: int | None
    shown_tenth: int = -1


@final
class LiveFooter:
    """The running cell and fan-outs of one run on *console* (see the module docstring).

    *live*: redraw a footer (only honoured on a terminal); False prints plain lines only.
    *clock* gives the elapsed time (``time.monotonic``).
    """

    def __init__(self, console: Console, *, live: bool = True, clock: Any = time.monotonic) -> None:
        self.console = console
        self._redraw = live and console.is_terminal
        self._clock = clock
        self._live: Live | None = None
        self._cell: tuple[int, int, float] | None = None  # (cell, turn, started)
        self._fanouts: dict[int, _FanOut] = {}
        self._tokens = 0
        self._cost: int | None = 0
        self._asking: set[str] = set()
        self._started: dict[int, tuple[int, int | None]] = {}  # fan-outs' tokens and cost then

    @property
    def fanning_out(self) -> bool:
        """Whether a ``predict_many`` fan-out is in flight."""
        return bool(self._fanouts or self._started)

    def host_call_started(self, p: dict[str, Any]) -> None:
        """A ``HostCallStarted`` event: a ``predict_many`` fan-out counts its spend from now."""
        if p["name"] == "predict_many":
            self._started[int(p["call_id"])] = (self._tokens, self._cost)

    def cell_started(self, p: dict[str, Any]) -> None:
        """A ``CellStarted`` event."""
        self._cell = (int(p["cell"]), int(p["turn"]), self._clock())
        self._update()

    def cell_finished(self) -> None:
        """The running cell ended (its ``ExecutionFinished``)."""
        self._cell = None
        self._fanouts.clear()  # a fan-out lives inside its cell
        self._started.clear()
        self._update()

    def usage(self, p: dict[str, Any]) -> None:
        """A ``UsageUpdated`` event: the session's totals so far."""
        u = p["usage"]
        self._tokens = int(u["input_tokens"]) + int(u["output_tokens"])
        self._cost = p["cost_micro_usd"]
        self._update()

    def predict(self, p: dict[str, Any]) -> None:
        """A ``PredictProgress`` event."""
        call = int(p["call_id"])
        fan = self._fanouts.get(call)
        if fan is None:
            tokens, cost = self._started.pop(call, (self._tokens, self._cost))
            fan = self._fanouts[call] = _FanOut(0, 0, 0, tokens, cost)
        fan.done, fan.total, fan.failed = int(p["done"]), int(p["total"]), int(p["failed"])
        finished = fan.done >= fan.total
        if not self._redraw:
            tenth = 10 * fan.done // max(fan.total, 1)
            if tenth > fan.shown_tenth:
                fan.shown_tenth = tenth
                self.console.print(self._fan_line(fan))
        if finished:
            if self._redraw:
                self.console.print(self._fan_line(fan))  # its last state stays in the log
            del self._fanouts[call]
        self._update()

    def asking(self, call_id: str, *, waiting: bool) -> None:
        """An approval question for *call_id* is (*waiting*) or is no longer on the terminal."""
        if waiting:
            self._asking.add(call_id)
        else:
            self._asking.discard(call_id)
        self._update()

    def close(self) -> None:
        """Take the footer down (idempotent)."""
        self._cell = None
        self._fanouts.clear()
        self._started.clear()
        self._update()

    def _fan_line(self, fan: _FanOut) -> Text:
        tokens = self._tokens - fan.tokens_at_start
        cost = (
            None
            if self._cost is None or fan.cost_at_start is None
            else (self._cost - fan.cost_at_start)
        )
        text = Text("predict_many ", style="bold")
        text.append(f"{fan.done}/{fan.total} done")
        if fan.failed:
            text.append(f" · {fan.failed} failed", style="red")
        text.append(f" · {tokens:,} tokens · {money(cost)}", style="dim")
        return text

    def __rich__(self) -> RenderableType:
        """The footer now: the fan-outs, then the running cell's elapsed line."""
        parts: list[RenderableType] = [self._fan_line(f) for f in self._fanouts.values()]
        if self._cell is not None:
            cell, turn, started = self._cell
            elapsed = self._clock() - started
            parts.append(
                Text(f"▶ cell {cell} · turn {turn} · running {elapsed:.1f}s", style="cyan")
            )
        return Group(*parts)

    def _update(self) -> None:
        """Show, refresh or take down the footer (terminal only)."""
        if not self._redraw:
            return
        wanted = (self._cell is not None or bool(self._fanouts)) and not self._asking
        if wanted and self._live is None:
            self._live = Live(
                self,
                console=self.console,
                refresh_per_second=_REFRESH_PER_S,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        elif not wanted and self._live is not None:
            self._live.stop()
            self._live = None
        elif self._live is not None:
            self._live.refresh()
