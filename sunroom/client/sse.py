"""A session's events as the client reads them: :class:`SessionEvent` and :func:`parse_sse`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, final

__all__ = ["END", "SessionEvent", "parse_sse"]

END = "end"
"""The kind of the stream's last message (``data``: ``status``, ``last_seq``); not an event."""


@final
@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One event of a session's log: its ``seq``, its ``type`` and its JSON ``data``.

    ``data`` holds every field the service sent (``seq``, ``ts`` and ``type`` too).
    """

    seq: int
    type: str
    data: dict[str, Any]


async def parse_sse(lines: AsyncIterable[str]) -> AsyncIterator[tuple[str, str, str]]:
    """The messages of an SSE stream of *lines*: (id, event, data); comments are skipped."""
    ident, kind, data = "", "message", list[str]()
    async for line in lines:
        if not line:
            if data:
                yield ident, kind, "\n".join(data)
            ident, kind, data = "", "message", list[str]()
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                ident = value
            elif name == "event":
                kind = value
            elif name == "data":
                data.append(value)


def event_of(kind: str, data: str) -> SessionEvent:
    """The event of one SSE message (its data is the event's JSON)."""
    payload = json.loads(data)
    return SessionEvent(seq=int(payload["seq"]), type=kind, data=payload)
