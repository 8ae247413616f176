"""Helpers for agent tests: scripted replies that run code, and transcript inspection."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterable

import pytest

from sunroom.agent import events as ev
from sunroom.providers import AssistantMessage, Request, ToolCall, ToolResultMessage, UserMessage
from tests.conftest import _require

_ids = itertools.count(1)


def code(src: str) -> AssistantMessage:
    """A reply that calls execute_code with *src*."""
    return AssistantMessage([ToolCall(f"call_{next(_ids)}", "execute_code", {"code": src})])


def last_output(request: Request) -> str:
    """The text the model was last shown (tool result or output message)."""
    for message in reversed(request.messages):
        if isinstance(message, ToolResultMessage):
            return message.content
        if isinstance(message, UserMessage):
            return message.text
    raise AssertionError("no output in the request")


def transcript_text(requests: list[Request]) -> str:
    """Everything every request showed a model, as one string."""
    return "\n".join(repr(r) for r in requests)


async def collect(sub: AsyncIterable[ev.Event]) -> list[ev.Event]:
    """Drain a subscription until the run ends."""
    out: list[ev.Event] = []
    async for event in sub:
        out.append(event)
        if isinstance(event, ev.SessionEnded):
            break
    return out


@pytest.fixture
def bwrap() -> str:
    """The default isolated backend (skipped where unavailable, unless CI requires it)."""
    return _require("bwrap")
