"""Rendering a session's log in a terminal (``sunroom run``, ``sunroom sessions show``).

:class:`Renderer` turns stored events into rich output: user messages, the model's text,
code cells with syntax highlighting, their output, host calls, a progress bar for
``predict_many`` fan-out, and a running line of tokens and cost. :func:`follow` reads a
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
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.syntax import Syntax
from rich.text import Text

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


def money(micro_usd: int | None) -> str:
    """``$0.0123``, or ``cost unknown``."""
    return "cost unknown" if micro_usd is None else f"${micro_usd / 1_000_000:.4f}"


@final
class Renderer:
    """Prints stored events on *console* (see the module docstring)."""

    def __init__(
        self, console: Console, *, images: Path | None = None, inline: Protocol | None = None
    ) -> None:
        """Print on *console*; save displayed images in the folder *images*, if given.

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
        self._progress: Progress | None = None
        self._bars: dict[int, TaskID] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "MessageReceived": self._message,
            "AssistantText": lambda p: self.console.print(Text(p["text"])),
            "Thinking": lambda p: self.console.print(Text(p["text"], style="dim italic")),
            "CodeSubmitted": self._code,
            "ExecutionFinished": self._output,
            "HostCallFinished": self._host_call,
            "PredictProgress": self._predict,
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

    def _code(self, p: dict[str, Any]) -> None:
        syntax = Syntax(p["code"], "python", theme="ansi_dark", line_numbers=False)
        self.console.print(Panel(syntax, title=f"cell · turn {p['turn']}", title_align="left"))

    def _output(self, p: dict[str, Any]) -> None:
        style = "green" if p["status"] == "ok" else "red"
        head = Text(f"{p['status']} · {p['duration_s']:.2f}s", style=style)
        if p.get("state_lost"):
            head.append(" · kernel restarted", style="yellow")
        self.console.print(head)
        if p["output"]:
            self.console.print(Text(p["output"], style="dim"))
        for item in p.get("outputs") or ():
            self._display(item)

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
        self._stop_progress()  # a live bar redraws over raw output
        self.console.file.write(escape(self._inline, image))
        self.console.file.flush()
        self._shown += 1
        return None

    def _host_call(self, p: dict[str, object]) -> None:
        style = "red" if p.get("error") else "blue"
        detail = p["error"] or f"{p['duration_s']:.2f}s"
        self._line(f"↳ {p['name']}()", style, detail)

    def _asked(self, p: dict[str, Any]) -> None:
        args = ", ".join(f"{k}={v!r}" for k, v in dict(p.get("arguments") or {}).items())
        self._line(f"? approval needed {p['name']}({args})", "bold yellow", f"id {p['call_id']}")

    def _answered(self, p: dict[str, object]) -> None:
        verdict = "✓ approved" if p["allow"] else "✗ denied"
        lease = " (for the rest of the run)" if p.get("lease") else ""
        style = "green" if p["allow"] else "red"
        self._line(f"{verdict} {p['name']}(){lease}", style, f"{p['reason']} · by {p.get('by')}")

    def _predict(self, p: dict[str, Any]) -> None:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("predict_many"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[failed]} failed"),
                console=self.console,
            )
            self._progress.start()
        call = int(p["call_id"])
        if call not in self._bars:
            self._bars[call] = self._progress.add_task("", total=p["total"], failed=0)
        self._progress.update(self._bars[call], completed=p["done"], failed=p["failed"])
        if p["done"] >= p["total"]:
            self._stop_progress()

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress, self._bars = None, {}

    def _usage(self, p: dict[str, Any]) -> None:
        u = p["usage"]
        self._line(
            f"· {p['model_calls']} calls · {u['input_tokens']} in / {u['output_tokens']} out "
            f"· {money(p['cost_micro_usd'])}",
            "dim",
        )

    def _ended(self, p: dict[str, Any]) -> None:
        self._stop_progress()
        r = p["result"]
        style = "bold green" if r["status"] == "success" else "bold red"
        self._line(f"■ {r['status']}", style, r.get("error") or "")
        if r.get("output") is not None:
            self.console.print(r["output"])

    def close(self) -> None:
        """Stop a progress bar left running."""
        self._stop_progress()


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
