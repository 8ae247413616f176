"""Building a session's model from its name: :func:`resolve_model`, and the test hook.

``resolve_model(spec, base_url)`` is :func:`sunroom.providers.model`, unless the environment
variable ``SUNROOM_FAKE_MODEL`` names a script file: then every model is a
:class:`~sunroom.providers.FunctionModel` replaying that script (**a test hook**: it lets the
CLI and a service in a subprocess run offline and deterministically; never set it in
production). The script is JSON: a list of replies, or ``{"replies": [...], "sub_reply":
...}``. A reply is a string (a text answer) or ``{"code": "...", "text": "..."}`` (an
``execute_code`` tool call with optional text). A root call gets the reply whose index is the
number of assistant messages already in its transcript, so a resumed session continues the
script where its transcript left off; a ``predict`` sub-call (no tools offered) gets
``sub_reply`` (default ``"ok"``); past the end the last reply repeats. ``"delay_s"`` makes
every call take that long (a model's latency).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from sunroom.errors import UsageError
from sunroom.providers import AssistantMessage, FunctionModel, Model, Request, ToolCall
from sunroom.providers import model as build_model

__all__ = ["FAKE_MODEL_ENV", "fake_model", "resolve_model"]

FAKE_MODEL_ENV = "SUNROOM_FAKE_MODEL"


def resolve_model(spec: str, base_url: str | None) -> Model:
    """The model named *spec* (the caller closes it); see the module docstring."""
    fake = os.environ.get(FAKE_MODEL_ENV)
    if fake:
        return fake_model(Path(fake))
    return build_model(spec, base_url=base_url)


def _reply(item: Any, index: int) -> AssistantMessage | str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("code"), str):
        parts: list[Any] = []
        if item.get("text"):
            parts.append(str(item["text"]))
        parts.append(ToolCall(f"call_{index}", "execute_code", {"code": item["code"]}))
        return AssistantMessage(parts)
    raise UsageError(f"fake model script: reply {index} must be a string or {{'code': ...}}")


def fake_model(path: Path) -> Model:
    """A :class:`FunctionModel` replaying the script at *path*. Raises UsageError."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the fake model script {str(path)!r}: {exc}") from None
    items = data.get("replies") if isinstance(data, dict) else data
    sub = data.get("sub_reply", "ok") if isinstance(data, dict) else "ok"
    delay = float(data.get("delay_s", 0)) if isinstance(data, dict) else 0.0
    if not isinstance(items, list) or not items:
        raise UsageError("a fake model script needs a non-empty list of replies")
    replies = [_reply(item, i) for i, item in enumerate(items)]

    async def answer(request: Request) -> AssistantMessage | str:
        if delay > 0:
            await asyncio.sleep(delay)
        if not request.tools:
            return str(sub)
        turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
        return replies[min(turn, len(replies) - 1)]

    return FunctionModel(answer, name="fake")
