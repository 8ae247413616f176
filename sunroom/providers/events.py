"""Typed events yielded by :meth:`Model.stream`.

A stream yields, in order: any number of :class:`TextDelta`, :class:`ThinkingDelta`,
:class:`ToolCallDelta`, :class:`ToolCallComplete` and :class:`UsageUpdate` events, then
exactly one :class:`Done` carrying the assembled :class:`~sunroom.providers.Response`.
Joining the deltas gives the same content as the final response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias, final

from .messages import ToolCall
from .response import Response, Usage

__all__ = [
    "Done",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallComplete",
    "ToolCallDelta",
    "UsageUpdate",
]


@final
@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of reply text."""

    text: str


@final
@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A piece of readable reasoning."""

    text: str


@final
@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call's JSON arguments, as the vendor streamed it.

    ``index`` numbers the tool calls of this reply from 0; ``arguments_delta`` is raw text
    that may split a JSON token anywhere. Wait for :class:`ToolCallComplete` to use the call.
    """

    index: int
    id: str
    name: str
    arguments_delta: str


@final
@dataclass(frozen=True, slots=True)
class ToolCallComplete:
    """A tool call whose arguments have fully arrived and been parsed."""

    index: int
    call: ToolCall


@final
@dataclass(frozen=True, slots=True)
class UsageUpdate:
    """Token usage so far (vendors report it at the start, the end, or as it grows)."""

    usage: Usage


@final
@dataclass(frozen=True, slots=True)
class Done:
    """The end of the stream, with the full response."""

    response: Response


StreamEvent: TypeAlias = (
    TextDelta | ThinkingDelta | ToolCallDelta | ToolCallComplete | UsageUpdate | Done
)
