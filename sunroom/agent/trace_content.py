"""A model call's messages as span attributes, in the GenAI conventions' JSON (opt-in).

Only when :func:`sunroom.tracing.captures_content` says so (the standard
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` variable), a ``chat`` span gets
``gen_ai.system_instructions``, ``gen_ai.input.messages`` and ``gen_ai.output.messages``:
JSON arrays of messages, each a role and its parts (``text``, ``reasoning``, ``tool_call``,
``tool_call_response``; an image is a part naming its media type, never its bytes). The
messages are those the model was sent, which a session has already redacted, so no registered
secret reaches them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from sunroom.providers import (
    AssistantMessage,
    ImagePart,
    Request,
    Response,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

__all__ = ["request_content", "response_content"]

Part = dict[str, object]


def _assistant_parts(message: AssistantMessage) -> list[Part]:
    parts: list[Part] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "content": part.text})
        elif isinstance(part, ThinkingPart):
            if not part.redacted:
                parts.append({"type": "reasoning", "content": part.text})
        elif isinstance(part, ToolCall):
            parts.append(
                {"type": "tool_call", "id": part.id, "name": part.name, "arguments": part.arguments}
            )
    return parts


def _user_parts(message: UserMessage) -> list[Part]:
    parts: list[Part] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "content": part.text})
        elif isinstance(part, ImagePart):
            parts.append({"type": "image", "media_type": part.media_type})
    return parts


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def request_content(request: Request) -> Mapping[str, str]:
    """The input messages of *request* as JSON, its system messages apart.

    Keys: ``gen_ai.input.messages``, and ``gen_ai.system_instructions`` when it has any.
    """
    system: list[Part] = []
    messages: list[dict[str, object]] = []
    for message in request.messages:
        if isinstance(message, SystemMessage):
            system.append({"type": "text", "content": message.text})
        elif isinstance(message, UserMessage):
            messages.append({"role": "user", "parts": _user_parts(message)})
        elif isinstance(message, AssistantMessage):
            messages.append({"role": "assistant", "parts": _assistant_parts(message)})
        elif isinstance(message, ToolResultMessage):
            response: Part = {
                "type": "tool_call_response",
                "id": message.tool_call_id,
                "response": message.content,
            }
            messages.append({"role": "tool", "parts": [response]})
    out = {"gen_ai.input.messages": _json(messages)}
    if system:
        out["gen_ai.system_instructions"] = _json(system)
    return out


def response_content(response: Response) -> Mapping[str, str]:
    """``gen_ai.output.messages`` of *response*, as JSON (one message and its finish reason)."""
    message = {
        "role": "assistant",
        "parts": _assistant_parts(response.message),
        "finish_reason": response.finish_reason,
    }
    return {"gen_ai.output.messages": _json([message])}
