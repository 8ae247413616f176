"""Vendor-neutral transcript types: messages, their parts, and tool specs.

Every type here is a frozen dataclass. A transcript is a sequence of :data:`Message`:
:class:`SystemMessage`, :class:`UserMessage`, :class:`AssistantMessage` and
:class:`ToolResultMessage`. Adapters translate these to and from each vendor's wire format.

Opaque vendor state that must be sent back verbatim (Anthropic thinking signatures, OpenAI
reasoning items, Gemini thought signatures) rides on the part that carried it, in an
:class:`Origin`. An adapter only replays an origin that its own vendor family produced; parts
from another vendor are sent as plain text or dropped (thinking), never forged.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias, final

__all__ = [
    "AssistantMessage",
    "AssistantPart",
    "ImagePart",
    "Message",
    "Origin",
    "SystemMessage",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolResultMessage",
    "ToolSpec",
    "UserMessage",
    "UserPart",
]


@final
@dataclass(frozen=True, slots=True)
class Origin:
    """Where a part came from, with the opaque state its vendor needs back.

    Attributes:
        provider: The vendor family that produced the part: ``"anthropic"``, ``"openai"``
            (Responses API), ``"openai-compatible"`` (Chat Completions) or ``"gemini"``.
        item_id: The vendor's id for the enclosing item (OpenAI Responses output items).
        signature: An opaque token to return verbatim (Anthropic thinking signature or
            redacted-thinking data, OpenAI encrypted reasoning, Gemini thought signature).
    """

    provider: str
    item_id: str | None = None
    signature: str | None = None


@final
@dataclass(frozen=True, slots=True)
class TextPart:
    """Plain text in a user or assistant message."""

    text: str
    origin: Origin | None = None


@final
@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image in a user message: inline bytes with a media type, or a URL.

    Exactly one of ``data`` and ``url`` must be given.
    """

    data: bytes | None = None
    media_type: str = "image/png"
    url: str | None = None

    def __post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            raise ValueError("ImagePart needs exactly one of data= or url=")

    def base64(self) -> str:
        """Return the inline bytes base64-encoded (ASCII); raises ValueError for a URL image."""
        if self.data is None:
            raise ValueError("this image is a URL, it has no inline data")
        return base64.b64encode(self.data).decode("ascii")


@final
@dataclass(frozen=True, slots=True)
class ThinkingPart:
    """The model's reasoning, kept in the transcript so the vendor can continue it.

    ``text`` is the readable reasoning or summary (it may be empty when the vendor hides it).
    ``redacted`` marks Anthropic's ``redacted_thinking``, whose data is in
    ``origin.signature``.
    """

    text: str
    origin: Origin | None = None
    redacted: bool = False


@final
@dataclass(frozen=True, slots=True)
class ToolCall:
    """A request from the model to call a tool.

    Attributes:
        id: The call id; a :class:`ToolResultMessage` answers it by this id.
        name: The tool's name.
        arguments: The parsed JSON arguments (an object).
        raw_arguments: The text the model produced when it was not a JSON object (for
            example cut off by the output-token limit); ``arguments`` is then empty.
        origin: Vendor state for replay (Gemini thought signature, OpenAI item id).
    """

    id: str
    name: str
    arguments: Mapping[str, object] = field(default_factory=dict)
    raw_arguments: str | None = None
    origin: Origin | None = None


UserPart: TypeAlias = TextPart | ImagePart
AssistantPart: TypeAlias = TextPart | ThinkingPart | ToolCall


def _user_parts(content: str | Iterable[UserPart | str]) -> tuple[UserPart, ...]:
    if isinstance(content, str):
        return (TextPart(content),)
    return tuple(TextPart(p) if isinstance(p, str) else p for p in content)


@final
@dataclass(frozen=True, slots=True)
class SystemMessage:
    """Instructions for the model; adapters send them the way the vendor expects."""

    text: str


@final
@dataclass(frozen=True, slots=True, init=False)
class UserMessage:
    """A user turn: text and images.

    ``UserMessage("hi")`` is shorthand for one text part; strings in a list become text parts.
    """

    content: tuple[UserPart, ...]

    def __init__(self, content: str | Iterable[UserPart | str]) -> None:
        object.__setattr__(self, "content", _user_parts(content))

    @property
    def text(self) -> str:
        """The text parts joined together."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


@final
@dataclass(frozen=True, slots=True, init=False)
class AssistantMessage:
    """A model turn: text, thinking and tool calls, in the order the model produced them.

    Strings (alone or in a list) become text parts.
    """

    content: tuple[AssistantPart, ...]

    def __init__(self, content: str | Iterable[AssistantPart | str]) -> None:
        parts: tuple[AssistantPart, ...] = (
            (TextPart(content),)
            if isinstance(content, str)
            else tuple(TextPart(p) if isinstance(p, str) else p for p in content)
        )
        object.__setattr__(self, "content", parts)

    @property
    def text(self) -> str:
        """The text parts joined together (thinking excluded)."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls, in order."""
        return tuple(p for p in self.content if isinstance(p, ToolCall))

    @property
    def thinking(self) -> tuple[ThinkingPart, ...]:
        """The thinking parts, in order."""
        return tuple(p for p in self.content if isinstance(p, ThinkingPart))


@final
@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    """The result of one tool call, sent back to the model.

    Attributes:
        tool_call_id: The :attr:`ToolCall.id` this answers.
        content: The result as text (serialize structured results yourself).
        is_error: True when the tool failed and ``content`` is the error message.
        name: The tool's name; when empty, adapters that need it (Gemini) look it up from
            the matching call earlier in the transcript.
    """

    tool_call_id: str
    content: str
    is_error: bool = False
    name: str = ""


Message: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage


@final
@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: a name, a description and a JSON schema for its arguments.

    ``parameters`` is a JSON schema of an object. ``strict`` asks vendors that support it
    (OpenAI) to constrain arguments to the schema exactly; the schema must then meet the
    vendor's strict-mode rules.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, object] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    strict: bool = False
