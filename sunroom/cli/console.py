"""Rendering a session's log in a terminal (``sunroom run``, ``sunroom sessions show``).

:class:`Renderer` turns stored events into rich output: user messages, the model's text,
code cells with syntax highlighting, their output as the cell writes it (``OutputChunk``
events, line by line, stdout dim and stderr red), the cell's result, host calls, and a
running line of tokens and cost; the running cell's elapsed time and ``predict_many``
progress are the footer of :mod:`sunroom.cli.live_view` (redrawn only with ``live=True`` on a
terminal). A cell's output printed as it came is not printed again at its end, unless what
the model saw differs from it (stderr, an error, a value, truncation). :func:`follow` reads a
session's log as it grows (the same way the SSE stream does) until no run is in progress.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable
from pathlib import Path
from typing import Any, final

from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from sunroom.agent.presets import extract_code, without_code
from sunroom.cli.live_view import LiveFooter, money
from sunroom.cli.terminal_images import Protocol, escape, refusal
from sunroom.service.journal import TRANSCRIPT
from sunroom.service.signals import Signals
from sunroom.store import EventStore, StoredEvent

__all__ = ["Renderer", "follow", "money"]

_IMAGE_SUFFIX = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
}


@final
class Renderer:
    """Prints stored events on *console* (see the module docstring)."""

    def __init__(
        self,
        console: Console,
        *,
        images: Path | None = None,
        inline: Protocol | None = None,
        live: bool = False,
    ) -> None:
        """Print on *console*; save displayed images in the folder *images*, if given.

        *live*: redraw a footer with the running cell's elapsed time and ``predict_many``
        progress (``sunroom run`` on a terminal; :class:`~sunroom.cli.live_view.LiveFooter`).

        With *inline*, images are also shown in the terminal with that graphics protocol
        (:mod:`sunroom.cli.terminal_images`), written raw to the console's file; one it
        cannot show is a line that says why. Every image is also a line: its path when saved,
        else its type and size.
        """
        self.console = console
        self._images = images
        self._inline = inline
        self._saved = 0
        self._shown = 0
        self._footer = LiveFooter(console, live=live)
        self._streamed: dict[str, list[str]] = {}  # the running cell's output as it came
        self._partial = ("stdout", "")  # a line not ended yet: (stream, text)
        self._held: str | None = None  # a reply whose fenced code may be the next cell
        self._last_text: str | None = None  # the last reply printed (a final answer repeats it)
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "MessageReceived": self._message,
            "AssistantText": self._text,
            "Thinking": lambda p: self.console.print(Text(p["text"], style="dim italic")),
            "CodeSubmitted": self._code,
            "CellStarted": self._cell_started,
            "OutputChunk": self._chunk,
            "ExecutionFinished": self._output,
            "HostCallStarted": self._footer.host_call_started,
            "HostCallFinished": self._host_call,
            "PredictProgress": self._footer.predict,
            "UsageUpdated": self._usage,
            "SubmitAccepted": lambda p: self._line("✓ submitted", "green", p.get("output")),
            "SubmitRejected": lambda p: self._line("✗ submit rejected", "yellow", p["reason"]),
            "Vetoed": lambda p: self._line(f"⊘ vetoed {p['what']}", "yellow", p["reason"]),
            "ApprovalRequested": self._asked,
            "ApprovalAnswered": self._answered,
            "BudgetWarning": lambda p: self._line("budget", "yellow", p["message"]),
            "ContextCompacted": lambda p: self._line("context compacted", "dim", p["removed"]),
            "SessionError": lambda p: self._line("error", "red", p["message"]),
            "KernelRestarted": lambda p: self._line("↻ kernel restarted", "yellow", p["reason"]),
            "CallOutcomeUnknown": lambda p: self._line(
                "? outcome unknown", "yellow", f"{p['name']}({p['args']}) call {p['call_id']}"
            ),
            "SessionEnded": self._ended,
        }

    def show(self, event: StoredEvent) -> None:
        """Print one event (internal and unknown kinds print nothing)."""
        if event.kind == TRANSCRIPT:
            return
        fenced_cell = event.kind == "CodeSubmitted" and event.payload.get("via") == "fenced"
        if self._held is not None and not fenced_cell:
            self._show_held()  # its fenced code did not run (it made tool calls): as written
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event.payload)

    def _line(self, label: str, style: str, detail: object = None) -> None:
        text = Text(label, style=style)
        if detail is not None:
            text.append(f" {detail}", style="default")
        self.console.print(text)

    def _message(self, p: dict[str, Any]) -> None:
        self.console.print(Text("› ", style="bold cyan") + Text(p["text"]))

    def _text(self, p: dict[str, Any]) -> None:
        """The model's text; held when it has fenced code, which the next cell may show."""
        if extract_code(p["text"]) is None:
            self.console.print(Text(p["text"]))
            self._last_text = p["text"]
        else:
            self._held = p["text"]

    def _show_held(self, *, ran: bool = False) -> None:
        """Print the held reply: without its fenced code when that code runs as the next cell."""
        held, self._held = self._held, None
        text = without_code(held or "") if ran else held
        if text:
            self.console.print(Text(text))

    def _code(self, p: dict[str, Any]) -> None:
        if self._held is not None:  # a fenced cell: its code is shown once, in the panel
            self._show_held(ran=True)
        syntax = Syntax(p["code"], "python", theme="ansi_dark", line_numbers=False)
        self.console.print(Panel(syntax, title=f"cell · turn {p['turn']}", title_align="left"))

    def _cell_started(self, p: dict[str, Any]) -> None:
        self._streamed = {}
        self._partial = ("stdout", "")
        self._footer.cell_started(p)

    def _chunk(self, p: dict[str, Any]) -> None:
        stream, text = str(p["stream"]), str(p["text"])
        if p.get("dropped_bytes"):
            self._end_line()
            self._streamed.setdefault("dropped", []).append(text)
            self.console.print(Text(text.rstrip("\n"), style="yellow"))
            return
        if stream != self._partial[0]:
            self._end_line()
        self._streamed.setdefault(stream, []).append(text)
        *lines, rest = (self._partial[1] + text).split("\n")
        self._partial = (stream, rest)
        for line in lines:
            self._stream_line(stream, line)

    def _end_line(self) -> None:
        stream, rest = self._partial
        if rest:
            self._stream_line(stream, rest)
        self._partial = (stream, "")

    def _stream_line(self, stream: str, line: str) -> None:
        self.console.print(Text(line, style="red" if stream == "stderr" else "dim"))

    def _output(self, p: dict[str, Any]) -> None:
        self._end_line()
        self._footer.cell_finished()
        style = "green" if p["status"] == "ok" else "red"
        head = Text(f"{p['status']} · {p['duration_s']:.2f}s", style=style)
        if p.get("state_lost"):
            head.append(" · kernel restarted", style="yellow")
        self.console.print(head)
        rest = self._unseen(str(p["output"]))
        if rest:
            self.console.print(Text(rest, style="dim"))
        for item in p.get("outputs") or ():
            self._display(item)

    def _unseen(self, output: str) -> str:
        """What of *output* (the model's view of the cell) its streamed chunks did not show.

        The model's view is the cell's stdout, its stderr after ``[stderr]``, then its value
        or error (:func:`~sunroom.agent.presets.render_result`); when it begins with what was
        streamed, only the rest is new. Otherwise (nothing streamed, truncation) all of it.
        """
        streamed, self._streamed = self._streamed, {}
        parts = [
            label + "".join(streamed[name]).rstrip("\n")
            for name, label in (("stdout", ""), ("stderr", "[stderr]\n"))
            if name in streamed
        ]
        shown = "\n".join(parts)
        if not shown or "dropped" in streamed:
            return output
        body = output
        if body.startswith("[status: "):  # the result's line says the status
            body = body.partition("\n")[2]
        return body[len(shown) :].lstrip("\n") if body.startswith(shown) else output

    def _display(self, item: dict[str, Any]) -> None:
        data = item.get("data") or {}
        mime = next((m for m in _IMAGE_SUFFIX if isinstance(data.get(m), str)), None)
        if mime is None:
            return  # text items are in the output the model was shown
        try:
            image = base64.b64decode(data[mime], validate=True)
        except (ValueError, binascii.Error):
            self._line("🖼 image", "yellow", f"{mime}: not valid base64, not saved")
            return
        why_not = self._show_inline(mime, image)
        note = "" if why_not is None else f" (not shown inline: {why_not})"
        if self._images is None:
            detail = f"{mime}, {len(image):,} bytes{note} (--images DIR saves it)"
            self._line("🖼 image", "magenta", detail)
            return
        self._images.mkdir(parents=True, exist_ok=True)
        self._saved += 1
        path = self._images / f"image-{self._saved:03d}{_IMAGE_SUFFIX[mime]}"
        path.write_bytes(image)
        self._line("🖼 image", "magenta", f"{path}{note}")

    def _show_inline(self, mime: str, image: bytes) -> str | None:
        """Show *image* in the terminal; why not, if it cannot be (None: shown or inline off)."""
        if self._inline is None:
            return None
        why_not = refusal(self._inline, mime, image, shown=self._shown)
        if why_not is not None:
            return why_not
        self.console.file.write(escape(self._inline, image))
        self.console.file.flush()
        self._shown += 1
        return None

    def _host_call(self, p: dict[str, object]) -> None:
        style = "red" if p.get("error") else "blue"
        detail = p["error"] or f"{p['duration_s']:.2f}s"
        self._line(f"↳ {p['name']}()", style, detail)

    def _asked(self, p: dict[str, Any]) -> None:
        self._footer.asking(str(p["call_id"]), waiting=True)  # never drawn over the prompt
        args = ", ".join(f"{k}={v!r}" for k, v in dict(p.get("arguments") or {}).items())
        self._line(f"? approval needed {p['name']}({args})", "bold yellow", f"id {p['call_id']}")

    def _answered(self, p: dict[str, object]) -> None:
        self._footer.asking(str(p["call_id"]), waiting=False)
        verdict = "✓ approved" if p["allow"] else "✗ denied"
        lease = " (for the rest of the run)" if p.get("lease") else ""
        style = "green" if p["allow"] else "red"
        self._line(f"{verdict} {p['name']}(){lease}", style, f"{p['reason']} · by {p.get('by')}")

    def _usage(self, p: dict[str, Any]) -> None:
        self._footer.usage(p)
        if p.get("sub_call") and self._footer.fanning_out:
            return  # the fan-out's line sums them up
        u = p["usage"]
        self._line(
            f"· {p['model_calls']} calls · {u['input_tokens']} in / {u['output_tokens']} out "
            f"· {money(p['cost_micro_usd'])}",
            "dim",
        )

    def _ended(self, p: dict[str, Any]) -> None:
        self._footer.close()
        r = p["result"]
        style = "bold green" if r["status"] == "success" else "bold red"
        self._line(f"■ {r['status']}", style, r.get("error") or "")
        output = r.get("output")
        # a plain-text answer is the model's last reply, already printed just above
        if output is not None and not (isinstance(output, str) and output == self._last_text):
            self.console.print(output)

    def close(self) -> None:
        """Print a reply still held; take down a footer left running."""
        if self._held is not None:
            self._show_held()
        self._footer.close()


async def follow(
    store: EventStore,
    signals: Signals | None,
    sid: str,
    on_event: Callable[[StoredEvent], None],
    *,
    after: int = 0,
    poll_s: float = 0.5,
) -> int:
    """Hand every event of *sid* after *after* to *on_event* until no run is in progress.

    Wakes on *signals* (this process's appends) or every *poll_s*. Returns the last seq seen.
    """
    while True:
        token = signals.token(sid) if signals is not None else None
        events = await store.events(sid, after_seq=after, limit=500)
        for e in events:
            on_event(e)
        if events:
            after = events[-1].seq
            continue
        record = await store.get_session(sid)
        if record is None or record.status != "running":
            if not await store.events(sid, after_seq=after, limit=1):
                return after
            continue
        if token is not None:
            await Signals.wait(token, poll_s)
        else:
            await asyncio.sleep(poll_s)
