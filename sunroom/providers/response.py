"""What a model returns: :class:`Response`, its :class:`Usage` and finish reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias, final

from .messages import AssistantMessage, ThinkingPart, ToolCall

__all__ = ["FinishReason", "Response", "Usage"]

FinishReason: TypeAlias = Literal["stop", "tool_use", "length", "content_filter", "error"]
"""Why the model stopped: a natural end (``stop``), to call tools (``tool_use``), the output
limit (``length``), a safety filter (``content_filter``) or a vendor-side failure (``error``)."""


@final
@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts for one call, normalized across vendors.

    Attributes:
        input_tokens: Every prompt token, cached or not.
        output_tokens: Every generated token, reasoning included.
        cache_read_tokens: The part of ``input_tokens`` read from the prompt cache.
        cache_write_tokens: The part of ``input_tokens`` written to the prompt cache.
        cache_write_1h_tokens: The part of ``cache_write_tokens`` written with a one-hour
            lifetime (Anthropic), billed at its own rate.
        reasoning_tokens: The part of ``output_tokens`` spent on hidden reasoning.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_write_1h_tokens=self.cache_write_1h_tokens + other.cache_write_1h_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


@final
@dataclass(frozen=True, slots=True)
class Response:
    """A model's reply.

    Attributes:
        message: The reply as an :class:`AssistantMessage`; append it to the transcript.
        finish_reason: Why the model stopped.
        usage: Token counts.
        cost_micro_usd: Cost in integer micro-USD (1 USD = 1,000,000), or ``None`` when the
            model or one of the token kinds it used has no known price.
        model: The model that answered, as the vendor named it.
        id: The vendor's response id, when it gave one.
        raw_finish_reason: The vendor's own finish/stop reason string.
    """

    message: AssistantMessage
    finish_reason: FinishReason
    usage: Usage
    cost_micro_usd: int | None = None
    model: str = ""
    id: str | None = None
    raw_finish_reason: str | None = None

    @property
    def text(self) -> str:
        """The reply's text (thinking excluded)."""
        return self.message.text

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls in the reply, in order."""
        return self.message.tool_calls

    @property
    def thinking(self) -> tuple[ThinkingPart, ...]:
        """The thinking parts in the reply, in order."""
        return self.message.thinking
