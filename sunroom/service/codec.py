"""JSON forms of what a session produces: agent events, run results and transcript messages.

An agent event becomes ``(kind, payload)``: the kind is its type name (``"ExecutionFinished"``)
and the payload its fields without ``seq`` and ``ts`` (the store numbers events itself; the
store's seq is the SSE id), and without ``branch`` unless a branch published the event.
Values pydantic can serialise (models, dataclasses, enums) become JSON; anything else becomes
its ``repr``. Transcript messages round-trip exactly through
:func:`message_to_json` / :func:`message_from_json`, vendor state (origins) included.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import Any, TypedDict

from pydantic_core import PydanticSerializationError, to_jsonable_python

from sunroom.agent import events as ev
from sunroom.agent.result import RunResult
from sunroom.errors import UsageError
from sunroom.providers import (
    AssistantMessage,
    ImagePart,
    Message,
    Origin,
    SystemMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "event_to_json",
    "jsonable",
    "message_from_json",
    "message_to_json",
    "result_to_json",
]


def jsonable(value: object) -> Any:
    """*value* as JSON data (pydantic's rules; ``repr`` for what it cannot serialise)."""
    try:
        return to_jsonable_python(value, fallback=repr)
    except (PydanticSerializationError, TypeError, ValueError):
        return repr(value)


def result_to_json(result: RunResult, *, session_id: str) -> dict[str, object]:
    """A run result as JSON, with the service's session id."""
    out = {f.name: jsonable(getattr(result, f.name)) for f in dataclasses.fields(result)}
    out["session_id"] = session_id
    return out


def event_to_json(event: ev.Event, *, session_id: str) -> tuple[str, dict[str, object]]:
    """``(kind, payload)`` of an agent event (see the module docstring)."""
    payload: dict[str, object] = {}
    for f in dataclasses.fields(event):
        if f.name in ("seq", "ts"):
            continue
        value = getattr(event, f.name)
        if f.name == "branch" and value is None:
            continue  # a session's own event: its payload is what it was before branches
        if isinstance(value, RunResult):
            payload[f.name] = result_to_json(value, session_id=session_id)
        else:
            payload[f.name] = jsonable(value)
    return type(event).__name__, payload


class _OriginJson(TypedDict):
    provider: str
    item_id: str | None
    signature: str | None


def _origin(o: Origin | None) -> dict[str, object] | None:
    return None if o is None else dataclasses.asdict(o)


def _origin_from(data: _OriginJson | None) -> Origin | None:
    return None if data is None else Origin(**data)


def _part_to_json(part: TextPart | ThinkingPart | ToolCall | ImagePart) -> dict[str, object]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text, "origin": _origin(part.origin)}
    if isinstance(part, ThinkingPart):
        return {
            "type": "thinking",
            "text": part.text,
            "redacted": part.redacted,
            "origin": _origin(part.origin),
        }
    if isinstance(part, ToolCall):
        return {
            "type": "tool_call",
            "id": part.id,
            "name": part.name,
            "arguments": jsonable(dict(part.arguments)),
            "raw_arguments": part.raw_arguments,
            "origin": _origin(part.origin),
        }
    return {
        "type": "image",
        "data": None if part.data is None else part.base64(),
        "media_type": part.media_type,
        "url": part.url,
    }


def _part_from_json(data: Mapping[str, Any]) -> TextPart | ThinkingPart | ToolCall | ImagePart:
    kind = data.get("type")
    origin = _origin_from(data.get("origin"))
    if kind == "text":
        return TextPart(data["text"], origin)
    if kind == "thinking":
        return ThinkingPart(data["text"], origin, bool(data.get("redacted")))
    if kind == "tool_call":
        return ToolCall(
            data["id"], data["name"], dict(data["arguments"]), data.get("raw_arguments"), origin
        )
    if kind == "image":
        raw = data.get("data")
        return ImagePart(
            None if raw is None else base64.b64decode(raw),
            data.get("media_type", "image/png"),
            data.get("url"),
        )
    raise UsageError(f"unknown message part type {kind!r}")


def message_to_json(message: Message) -> dict[str, object]:
    """A transcript message as JSON (exact: :func:`message_from_json` rebuilds it)."""
    if isinstance(message, SystemMessage):
        return {"role": "system", "text": message.text}
    if isinstance(message, UserMessage):
        return {"role": "user", "content": [_part_to_json(p) for p in message.content]}
    if isinstance(message, AssistantMessage):
        return {"role": "assistant", "content": [_part_to_json(p) for p in message.content]}
    return {
        "role": "tool",
        "tool_call_id": message.tool_call_id,
        "content": message.content,
        "is_error": message.is_error,
        "name": message.name,
    }


def message_from_json(data: Mapping[str, Any]) -> Message:
    """The message :func:`message_to_json` produced. Raises UsageError/KeyError if malformed."""
    role = data.get("role")
    if role == "system":
        return SystemMessage(data["text"])
    if role == "user":
        parts = [_part_from_json(p) for p in data["content"]]
        return UserMessage([p for p in parts if isinstance(p, TextPart | ImagePart)])
    if role == "assistant":
        parts = [_part_from_json(p) for p in data["content"]]
        return AssistantMessage([p for p in parts if not isinstance(p, ImagePart)])
    if role == "tool":
        return ToolResultMessage(
            data["tool_call_id"], data["content"], bool(data["is_error"]), data.get("name", "")
        )
    raise UsageError(f"unknown message role {role!r}")
