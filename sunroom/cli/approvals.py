"""Answering approval requests in ``sunroom run``: :class:`Asker` (y/n on a terminal).

When the live view shows an ``ApprovalRequested`` event, the asker asks on the terminal
``approve name(args)? [y]es / [n]o / [a]lways this run`` and answers through the session
manager (``a`` is a lease: the function is allowed for the rest of the run). Without a terminal
on stdin it denies at once when ``auto_deny`` is set, and otherwise leaves the request to wait
(for its deadline, or an answer from elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, final

from rich.console import Console
from rich.text import Text

from sunroom.errors import SunroomError
from sunroom.store import StoredEvent

__all__ = ["NO_TTY_REASON", "Asker", "parse_rules"]

NO_TTY_REASON: Final = "no terminal to ask on (sunroom run --auto-deny)"
"""The reason of an answer ``--auto-deny`` gives."""


def parse_rules(pairs: list[str], fail: Callable[[str], Exception]) -> dict[str, str]:
    """``--approval NAME=POLICY`` pairs as a mapping; raises ``fail(message)`` when malformed."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, policy = pair.rpartition("=")
        if not sep or not name or policy not in ("allow", "deny", "ask"):
            raise fail(f"--approval takes NAME=allow|deny|ask (NAME may be a glob), got {pair!r}")
        out[name] = policy
    return out


@final
class Asker:
    """Answers a session's approval requests as the live view sees them (see the module).

    *manager* is the :class:`~sunroom.service.SessionManager` running session *sid*;
    *read_line* reads one answer (``input`` by default; it runs on a worker thread).
    """

    def __init__(
        self,
        manager: Any,
        sid: str,
        console: Console,
        *,
        auto_deny: bool,
        interactive: bool | None = None,
        read_line: Callable[[str], str] = input,
    ) -> None:
        self._manager = manager
        self._sid = sid
        self._console = console
        self._auto_deny = auto_deny
        self._interactive = sys.stdin.isatty() if interactive is None else interactive
        self._read_line = read_line
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one question at a time

    def see(self, event: StoredEvent) -> None:
        """Start answering *event* when it is an approval request (other kinds are ignored)."""
        if event.kind != "ApprovalRequested":
            return
        task = asyncio.get_running_loop().create_task(self._answer(event.payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, p: dict[str, Any]) -> None:
        call_id = str(p["call_id"])
        if not self._interactive:
            if self._auto_deny:
                await self._send(call_id, allow=False, reason=NO_TTY_REASON, lease=False)
            else:
                self._console.print(
                    Text(f"… {p['name']}() waits for approval (no terminal to ask on)", "yellow")
                )
            return
        args = ", ".join(f"{k}={v!r}" for k, v in dict(p.get("arguments") or {}).items())
        question = f"approve {p['name']}({args})? [y]es / [n]o / [a]lways this run: "
        async with self._lock:
            reply = await self._line(question)
        choice = reply.strip().lower()[:1]
        allow, lease = choice in ("y", "a"), choice == "a"
        reason = None if allow else "denied at the terminal"
        await self._send(call_id, allow=allow, reason=reason, lease=lease)

    async def _line(self, question: str) -> str:
        """One line read on a daemon thread (an abandoned question never holds up the exit)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()

        def settle(text: str) -> None:
            if not done.done():
                done.set_result(text)

        def read() -> None:
            try:
                text = self._read_line(question)
            except (EOFError, OSError):
                text = ""  # no answer is a denial
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, text)

        threading.Thread(target=read, name="sunroom-approval-prompt", daemon=True).start()
        return await done

    async def _send(self, call_id: str, *, allow: bool, reason: str | None, lease: bool) -> None:
        try:
            await self._manager.approve(self._sid, call_id, allow=allow, reason=reason, lease=lease)
        except SunroomError as exc:  # answered meanwhile (a lease, its deadline): say so
            self._console.print(Text(f"approval {call_id}: {exc}", "yellow"))

    async def aclose(self) -> None:
        """Stop asking (a question still on the terminal is abandoned)."""
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
