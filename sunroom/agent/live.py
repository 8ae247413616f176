"""The live output of a session's running cell: :class:`LiveOutput`.

The kernel streams what a cell writes to stdout and stderr while it runs (its ``on_output``).
A session hands that to its :class:`LiveOutput`, which publishes a
:class:`~sunroom.agent.events.CellStarted` when a cell begins and
:class:`~sunroom.agent.events.OutputChunk` events as the cell writes, all before the cell's
:class:`~sunroom.agent.events.ExecutionFinished`. The chunks are:

- **coalesced**: the first write of a cell is published at once; writes arriving within
  ``window_s`` (50 ms) of the last published chunk wait and go out together as one chunk at
  the end of the window, so a tight print loop makes at most ~20 events a second;
- **bounded**: at most ``max_bytes`` (:data:`LIVE_OUTPUT_BYTES`) of a cell's output is
  streamed; the rest is counted, and the cell's last chunk is then one marker whose
  ``dropped_bytes`` says how much was not streamed (the cell's ``ExecutionFinished`` still
  carries its output, head and tail, as the model saw it);
- **redacted** like every event: published through the session's redacting ``publish``, and
  text that could be the start of a secret whose end has not arrived yet is held back until
  more output completes it or the cell ends (:meth:`~sunroom.agent.redaction.Redactor.ready`),
  so a secret split across writes never shows a fragment.

Output written between cells (a background thread's) is not published. Everything here runs
on the session's event loop (the kernel's output callback is called there).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Final, final

from sunroom.agent import events as ev
from sunroom.agent.calls import Publish
from sunroom.agent.guard import Guard

__all__ = ["COALESCE_S", "LIVE_OUTPUT_BYTES", "LiveOutput"]

LIVE_OUTPUT_BYTES: Final = 256 * 1024
"""Bytes of one cell's output streamed as ``OutputChunk`` events, at most."""

COALESCE_S: Final = 0.05
"""Writes within this many seconds of the last published chunk are merged into one."""


@final
class LiveOutput:
    """Turns a running cell's streamed output into events (see the module docstring).

    Args:
        publish: the session's publish (it redacts every field).
        guard: the session's guard (what may be shown of text still arriving).
        max_bytes: bytes of a cell's output streamed at most (UTF-8).
        window_s: the coalescing window.
        clock: the monotonic clock the window is measured with.
    """

    def __init__(
        self,
        *,
        publish: Publish,
        guard: Guard,
        max_bytes: int = LIVE_OUTPUT_BYTES,
        window_s: float = COALESCE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._publish = publish
        self._guard = guard
        self._max_bytes = max_bytes
        self._window_s = window_s
        self._clock = clock
        self._cells = 0
        self._turn = 0
        self._active = False
        self._stream = "stdout"
        self._held = ""
        self._streamed = 0
        self._dropped = 0
        self._last = -math.inf
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, turn: int, code: str) -> None:
        """A cell of *turn* starts running *code*: publish ``CellStarted``."""
        self._cells += 1
        self._turn = turn
        self._active = True
        self._held, self._streamed, self._dropped = "", 0, 0
        self._last = -math.inf
        self._publish(ev.CellStarted, turn=turn, cell=self._cells, lines=len(code.splitlines()))

    def feed(self, stream: str, text: str) -> None:
        """The kernel's output callback: *text* written to *stream* (``stdout``/``stderr``)."""
        if not self._active or not text:
            return
        data = text.encode("utf-8", "surrogatepass")
        room = self._max_bytes - self._streamed
        if len(data) > room:
            text = data[: max(room, 0)].decode("utf-8", "ignore")
            kept = len(text.encode("utf-8", "surrogatepass"))
            self._dropped += len(data) - kept
            data = data[:kept]
        self._streamed += len(data)
        if not text:
            return
        if stream != self._stream:
            self._flush(final=True)  # keep the order of what the two streams wrote
            self._stream = stream
        self._held += text
        wait = self._last + self._window_s - self._clock()
        if wait <= 0:
            self._flush(final=False)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait, self._tick)

    def end(self) -> None:
        """The cell ended: publish everything held, then the dropped-bytes marker if any."""
        if not self._active:
            return
        self._active = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flush(final=True)
        if self._dropped:
            self._publish(
                ev.OutputChunk,
                turn=self._turn,
                cell=self._cells,
                stream=self._stream,
                text=f"[... {self._dropped} more bytes of output were not streamed ...]\n",
                dropped_bytes=self._dropped,
            )

    def _tick(self) -> None:
        self._timer = None
        if self._active:
            self._flush(final=False)

    def _flush(self, *, final: bool) -> None:
        """Publish the held text (*final*: all of it; else what cannot be part of a secret)."""
        if not self._held:
            return
        n = len(self._held) if final else self._guard.ready(self._held)
        if n == 0:
            return  # all of it may begin a secret: it waits for more output or the cell's end
        text, self._held = self._held[:n], self._held[n:]
        self._last = self._clock()
        self._publish(
            ev.OutputChunk, turn=self._turn, cell=self._cells, stream=self._stream, text=text
        )
