"""Language models behind one seam, :class:`Model`.

Resolve a model from a string with :func:`model` (``"anthropic:claude-sonnet-4-5"``,
``"openai:gpt-5"``, ``"openai-compatible:llama3"``, ``"gemini:gemini-2.5-flash"``) or build
one explicitly (:class:`AnthropicModel`, :class:`OpenAIResponsesModel`,
:class:`OpenAIChatModel`, :class:`GeminiModel`). In tests use :class:`ScriptedModel` or
:class:`FunctionModel`. The vendor adapters import their SDKs only when built, so importing
this package needs none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .assembly import events_from_response
from .config import ClientConfig, ModelOptions
from .events import (
    Done,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallComplete,
    ToolCallDelta,
    UsageUpdate,
)
from .fakes import FunctionModel, ScriptedModel, ScriptExhaustedError
from .messages import (
    AssistantMessage,
    ImagePart,
    Message,
    Origin,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from .pricing import DEFAULT_PRICES, LongContext, Price, PriceTable
from .registry import PROVIDERS, model
from .response import FinishReason, Response, Usage
from .retry import CircuitBreaker, Clock, RetryPolicy
from .seam import Model
from .settings import OutputSchema, Request, Settings
from .tokens import estimate_text_tokens, estimate_tokens

if TYPE_CHECKING:
    from .anthropic import AnthropicModel
    from .gemini import GeminiModel
    from .openai_chat import OpenAIChatModel
    from .openai_responses import OpenAIResponsesModel

_ADAPTERS = {
    "AnthropicModel": ".anthropic",
    "GeminiModel": ".gemini",
    "OpenAIChatModel": ".openai_chat",
    "OpenAIResponsesModel": ".openai_responses",
}


def __getattr__(name: str) -> object:
    module = _ADAPTERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = [
    "DEFAULT_PRICES",
    "PROVIDERS",
    "AnthropicModel",
    "AssistantMessage",
    "CircuitBreaker",
    "ClientConfig",
    "Clock",
    "Done",
    "FinishReason",
    "FunctionModel",
    "GeminiModel",
    "ImagePart",
    "LongContext",
    "Message",
    "Model",
    "ModelOptions",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "Origin",
    "OutputSchema",
    "Price",
    "PriceTable",
    "Request",
    "Response",
    "RetryPolicy",
    "ScriptExhaustedError",
    "ScriptedModel",
    "Settings",
    "StreamEvent",
    "SystemMessage",
    "TextDelta",
    "TextPart",
    "ThinkingDelta",
    "ThinkingPart",
    "ToolCall",
    "ToolCallComplete",
    "ToolCallDelta",
    "ToolResultMessage",
    "ToolSpec",
    "Usage",
    "UsageUpdate",
    "UserMessage",
    "estimate_text_tokens",
    "estimate_tokens",
    "events_from_response",
    "model",
]
