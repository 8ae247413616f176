"""A local, offline token estimate for a request.

It is an estimate, not a count: about four characters per token for prose, plus a small
overhead per message and per tool. Use a model's :meth:`~sunroom.providers.Model.count_tokens`
for the vendor's own count where one exists.
"""

from __future__ import annotations

import json
import math

from .messages import (
    AssistantMessage,
    ImagePart,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from .settings import Request

__all__ = ["estimate_tokens", "estimate_text_tokens"]

_CHARS_PER_TOKEN = 4.0
_PER_MESSAGE = 4
_PER_TOOL = 8
_PER_IMAGE = 1_000  # a mid-size image; vendors charge 85 to ~1,600 depending on size


def estimate_text_tokens(text: str) -> int:
    """Estimate the tokens in ``text`` (at least 1 for non-empty text)."""
    if not text:
        return 0
    # Non-ASCII text (CJK, emoji) runs nearer one token per character.
    ascii_chars = sum(1 for ch in text if ch < "\x80")
    other = len(text) - ascii_chars
    return max(1, math.ceil(ascii_chars / _CHARS_PER_TOKEN + other))


def estimate_tokens(request: Request) -> int:
    """Estimate the prompt tokens of ``request``: messages, tools and output schema."""
    total = 0
    for message in request.messages:
        total += _PER_MESSAGE
        if isinstance(message, SystemMessage):
            total += estimate_text_tokens(message.text)
        elif isinstance(message, UserMessage):
            for part in message.content:
                if isinstance(part, TextPart):
                    total += estimate_text_tokens(part.text)
                elif isinstance(part, ImagePart):
                    total += _PER_IMAGE
        elif isinstance(message, AssistantMessage):
            for apart in message.content:
                if isinstance(apart, TextPart | ThinkingPart):
                    total += estimate_text_tokens(apart.text)
                elif isinstance(apart, ToolCall):
                    args = apart.raw_arguments or json.dumps(dict(apart.arguments))
                    total += estimate_text_tokens(apart.name + args)
        elif isinstance(message, ToolResultMessage):
            total += estimate_text_tokens(message.content)
    for tool in request.tools:
        schema = json.dumps(dict(tool.parameters), separators=(",", ":"))
        total += _PER_TOOL + estimate_text_tokens(tool.name + tool.description + schema)
    if request.output_schema is not None:
        total += estimate_text_tokens(json.dumps(dict(request.output_schema.schema)))
    return total
