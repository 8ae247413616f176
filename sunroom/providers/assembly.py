"""Turning streamed pieces into a :class:`Response`, and a response back into events."""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import final

from .events import (
    Done,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallComplete,
    ToolCallDelta,
    UsageUpdate,
)
from .messages import AssistantMessage, AssistantPart, Origin, TextPart, ThinkingPart, ToolCall
from .response import FinishReason, Response, Usage

__all__ = ["ResponseBuilder", "events_from_response", "parse_arguments"]


def parse_arguments(raw: str) -> tuple[Mapping[str, object], str | None]:
    """Parse tool-call arguments: ``(object, None)``, or ``({}, raw)`` when not a JSON object."""
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except ValueError:
        return {}, raw
    if not isinstance(value, dict):
        return {}, raw
    return value, None


def _pieces(text: str, size: int | None) -> list[str]:
    if not text:
        return []
    if size is None:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]


def events_from_response(
    response: Response, *, chunk_size: int | None = None
) -> Iterator[StreamEvent]:
    """Yield the events a stream of ``response`` would have produced, ending with ``Done``.

    ``chunk_size`` splits text, thinking and tool arguments into pieces of that many
    characters (splitting JSON mid-token, as vendors do); ``None`` sends each whole.
    """
    index = 0
    for part in response.message.content:
        if isinstance(part, TextPart):
            for piece in _pieces(part.text, chunk_size):
                yield TextDelta(piece)
        elif isinstance(part, ThinkingPart):
            for piece in _pieces(part.text, chunk_size):
                yield ThinkingDelta(piece)
        else:
            raw = part.raw_arguments
            if raw is None:
                raw = json.dumps(dict(part.arguments), separators=(",", ":"))
            yield ToolCallDelta(index, part.id, part.name, "")
            for piece in _pieces(raw, chunk_size):
                yield ToolCallDelta(index, part.id, part.name, piece)
            yield ToolCallComplete(index, part)
            index += 1
    yield UsageUpdate(response.usage)
    yield Done(response)


@dataclass(slots=True)
class _Slot:
    kind: str  # text | thinking | tool
    text: list[str] = field(default_factory=list)
    origin: Origin | None = None
    redacted: bool = False
    tool_id: str = ""
    tool_name: str = ""
    tool_index: int = -1
    done: ToolCall | None = None


@final
class ResponseBuilder:
    """Accumulates streamed pieces keyed by the vendor's block id, in arrival order.

    Each method returns the event to yield (or ``None``). :meth:`build` returns the final
    response; a tool call still open then (a stream cut by the token limit) is closed with
    whatever arguments arrived.
    """

    __slots__ = ("_slots", "_tools", "usage")

    def __init__(self) -> None:
        self._slots: dict[Hashable, _Slot] = {}
        self._tools = 0
        self.usage = Usage()

    def _slot(self, key: Hashable, kind: str) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(kind)
        return slot

    def text(self, key: Hashable, delta: str, origin: Origin | None = None) -> TextDelta | None:
        """Append reply text to block ``key``."""
        slot = self._slots.get(key) or self._slot(key, "text")
        if origin is not None:
            slot.origin = origin
        if not delta:
            return None
        slot.text.append(delta)
        return TextDelta(delta)

    def thinking(
        self, key: Hashable, delta: str, origin: Origin | None = None, *, redacted: bool = False
    ) -> ThinkingDelta | None:
        """Append reasoning to block ``key``; ``origin`` (when given) replaces the block's."""
        slot = self._slot(key, "thinking")
        if origin is not None:
            slot.origin = origin
        slot.redacted = slot.redacted or redacted
        if not delta:
            return None
        slot.text.append(delta)
        return ThinkingDelta(delta)

    def set_origin(self, key: Hashable, origin: Origin) -> None:
        """Attach vendor state (a signature that arrived late) to block ``key``."""
        slot = self._slots.get(key)
        if slot is not None:
            slot.origin = origin

    def origin_of(self, key: Hashable) -> Origin | None:
        """Return block ``key``'s origin, if any."""
        slot = self._slots.get(key)
        return None if slot is None else slot.origin

    def tool_start(
        self, key: Hashable, tool_id: str, name: str, origin: Origin | None = None
    ) -> ToolCallDelta:
        """Open a tool call block; the returned delta (empty arguments) announces it."""
        slot = self._slot(key, "tool")
        slot.tool_id, slot.tool_name, slot.origin = tool_id, name, origin
        if slot.tool_index < 0:
            slot.tool_index = self._tools
            self._tools += 1
        return ToolCallDelta(slot.tool_index, tool_id, name, "")

    def has_tool(self, key: Hashable) -> bool:
        """Whether a tool call block ``key`` was opened."""
        slot = self._slots.get(key)
        return slot is not None and slot.kind == "tool"

    @property
    def tool_count(self) -> int:
        """How many tool calls were opened."""
        return self._tools

    def has_arguments(self, key: Hashable) -> bool:
        """Whether tool block ``key`` received any argument text."""
        slot = self._slots.get(key)
        return slot is not None and bool(slot.text)

    def tool_args(self, key: Hashable, delta: str) -> ToolCallDelta | None:
        """Append a fragment of JSON arguments to tool block ``key``."""
        slot = self._slots[key]
        if not delta:
            return None
        slot.text.append(delta)
        return ToolCallDelta(slot.tool_index, slot.tool_id, slot.tool_name, delta)

    def tool_end(self, key: Hashable, origin: Origin | None = None) -> ToolCallComplete | None:
        """Close tool block ``key``: parse its arguments and return the completed call."""
        slot = self._slots.get(key)
        if slot is None or slot.kind != "tool" or slot.done is not None:
            return None
        if origin is not None:
            slot.origin = origin
        arguments, raw = parse_arguments("".join(slot.text))
        slot.done = ToolCall(slot.tool_id, slot.tool_name, arguments, raw, slot.origin)
        return ToolCallComplete(slot.tool_index, slot.done)

    def open_tools(self) -> list[Hashable]:
        """Keys of tool blocks not yet closed."""
        return [k for k, s in self._slots.items() if s.kind == "tool" and s.done is None]

    def build(
        self,
        finish_reason: FinishReason,
        *,
        model: str = "",
        id: str | None = None,  # noqa: A002
        raw_finish_reason: str | None = None,
    ) -> Response:
        """Return the assembled response (cost is filled in by the caller)."""
        for key in self.open_tools():
            self.tool_end(key)
        parts: list[AssistantPart] = []
        for slot in self._slots.values():
            if slot.kind == "tool":
                assert slot.done is not None
                parts.append(slot.done)
            elif slot.kind == "thinking":
                parts.append(ThinkingPart("".join(slot.text), slot.origin, slot.redacted))
            elif slot.text or slot.origin is not None:
                parts.append(TextPart("".join(slot.text), slot.origin))
        return Response(
            message=AssistantMessage(parts),
            finish_reason=finish_reason,
            usage=self.usage,
            model=model,
            id=id,
            raw_finish_reason=raw_finish_reason,
        )


def with_cost(response: Response, cost: int | None) -> Response:
    """Return ``response`` with ``cost_micro_usd`` set."""
    return replace(response, cost_micro_usd=cost)
