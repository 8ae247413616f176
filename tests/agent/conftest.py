"""Helpers for agent tests: scripted replies that run code, transcript inspection, spans."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

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


class _Recorder(SimpleSpanProcessor):
    """Hands ended spans to its exporter only while a test asked for them (:func:`spans`)."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        super().__init__(exporter)
        self.on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            super().on_end(span)


_EXPORTER = InMemorySpanExporter()
_RECORDER = _Recorder(_EXPORTER)


@pytest.fixture(scope="session")
def _tracer_provider() -> TracerProvider:
    """The process's global TracerProvider, set once (OpenTelemetry allows only one)."""
    provider = TracerProvider()
    provider.add_span_processor(_RECORDER)
    trace.set_tracer_provider(provider)
    return provider


@pytest.fixture
def spans(_tracer_provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """The spans ended during the test (the global provider's, cleared before and after)."""
    _EXPORTER.clear()
    _RECORDER.on = True
    try:
        yield _EXPORTER
    finally:
        _RECORDER.on = False
        _EXPORTER.clear()
