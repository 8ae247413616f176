from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

import pytest

from sunroom.errors import ClosedError, UsageError
from sunroom.providers import (
    AssistantMessage,
    Done,
    ImagePart,
    Model,
    OpenAIChatModel,
    Request,
    Response,
    Settings,
    SystemMessage,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
    estimate_text_tokens,
    estimate_tokens,
    events_from_response,
)
from sunroom.providers.assembly import ResponseBuilder, parse_arguments

from .conftest import collect
from .replay import ReplayServer, reply_from


def test_messages_are_frozen_and_normalized() -> None:
    msg = UserMessage(["look", ImagePart(url="https://x/y.png")])
    assert msg.content[0] == TextPart("look") and msg.text == "look"
    with pytest.raises(AttributeError):
        msg.content = ()  # type: ignore[misc]
    reply = AssistantMessage(["a", ThinkingPart("t"), ToolCall("1", "f", {"x": 1}), "b"])
    assert (reply.text, len(reply.tool_calls), len(reply.thinking)) == ("ab", 1, 1)
    with pytest.raises(ValueError, match="exactly one"):
        ImagePart()


def test_request_and_settings() -> None:
    request = Request([UserMessage("hi")], tools=[ToolSpec("f")])
    assert isinstance(request.messages, tuple) and request.settings == Settings()
    with pytest.raises(UsageError, match="duplicate"):
        Request([], tools=[ToolSpec("f"), ToolSpec("f")])
    with pytest.raises(UsageError):
        Settings(timeout=0)
    assert Settings(stop="END").stop == ("END",)  # type: ignore[arg-type]
    base = Settings(temperature=0.1, max_output_tokens=10, extra_body={"a": 1, "b": 1})
    merged = base.merged(Settings(max_output_tokens=20, extra_body={"b": 2}))
    assert merged == Settings(temperature=0.1, max_output_tokens=20, extra_body={"a": 1, "b": 2})
    assert base.merged(Settings()) is base


def test_estimates() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abcd" * 25) == 25
    assert estimate_text_tokens("\u4f60\u597d") == 2
    request = Request(
        [
            SystemMessage("be brief"),
            UserMessage("hello there"),
            AssistantMessage([ToolCall("1", "f", {"x": 1})]),
            ToolResultMessage("1", "ok"),
        ],
        tools=[ToolSpec("f", "does f")],
    )
    assert 20 < estimate_tokens(request) < 80


def test_parse_arguments() -> None:
    assert parse_arguments("") == ({}, None)
    assert parse_arguments('{"a": 1}') == ({"a": 1}, None)
    assert parse_arguments('{"a": ') == ({}, '{"a": ')
    assert parse_arguments("[1]") == ({}, "[1]")


def test_builder_orders_parts_by_arrival() -> None:
    b = ResponseBuilder()
    b.thinking(0, "hm")
    b.text(1, "hel")
    b.tool_start(2, "c1", "f")
    b.tool_args(2, '{"a"')
    b.text(1, "lo")
    b.tool_args(2, ": 1}")
    response = b.build("tool_use")
    assert [type(p).__name__ for p in response.message.content] == [
        "ThinkingPart",
        "TextPart",
        "ToolCall",
    ]
    assert response.text == "hello" and response.tool_calls[0].arguments == {"a": 1}


def test_events_from_response_round_trip() -> None:
    response = Response(
        AssistantMessage(["hi", ToolCall("1", "f", {"a": [1, 2]})]), "tool_use", Usage(1, 1)
    )
    events = list(events_from_response(response, chunk_size=3))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "hi"
    assert events[-1] == Done(response)


class Echo(Model):
    name = "echo"

    async def complete(self, request: Request) -> Response:
        return Response(AssistantMessage(request.messages[-1].text), "stop", Usage())  # type: ignore[union-attr]


async def test_minimal_model_gets_stream_and_count_for_free() -> None:
    async with Echo() as m:
        events = await collect(m.stream(Request([UserMessage("yo")])))
        assert events[0] == TextDelta("yo") and isinstance(events[-1], Done)
        assert await m.count_tokens(Request([UserMessage("yo")])) > 0


async def test_shared_model_serves_concurrent_calls(server: ReplayServer) -> None:
    path = "/v1/chat/completions"
    server.add(path, reply_from("openai/chat_text"), times=None)
    async with OpenAIChatModel("m", base_url=server.url + "/v1") as m:
        results = await asyncio.gather(
            *(m.complete(Request([UserMessage(str(i))])) for i in range(20))
        )
    assert {r.text for r in results} == {results[0].text}
    sent = sorted(json.loads(r.body)["messages"][0]["content"] for r in server.requests)
    assert sent == sorted(str(i) for i in range(20))


async def test_closed_model_refuses(server: ReplayServer) -> None:
    m = OpenAIChatModel("m", base_url=server.url + "/v1")
    await m.aclose()
    await m.aclose()  # idempotent
    with pytest.raises(ClosedError):
        await m.complete(Request([UserMessage("x")]))


def test_model_is_bound_to_its_event_loop(server: ReplayServer) -> None:
    server.add("/v1/chat/completions", reply_from("openai/chat_text"), times=None)
    m = OpenAIChatModel("m", base_url=server.url + "/v1")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(m.complete(Request([UserMessage("x")])))
        with pytest.raises(UsageError, match="another event loop"):
            asyncio.run(m.complete(Request([UserMessage("x")])))
    finally:
        loop.run_until_complete(m.aclose())
        loop.close()


T = TypeVar("T")


def closeable(stream: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """``stream`` as the async generator it is: ``Model.stream`` is typed as an
    ``AsyncIterator``, but ``contextlib.aclosing`` needs ``aclose()``."""
    assert isinstance(stream, AsyncGenerator)
    return stream


async def test_stopping_a_stream_early_releases_it(server: ReplayServer) -> None:
    from contextlib import aclosing

    path = "/v1/chat/completions"
    server.add(path, reply_from("openai/chat_text_stream"))
    server.add(path, reply_from("openai/chat_text"))
    async with OpenAIChatModel("m", base_url=server.url + "/v1") as m:
        async with aclosing(closeable(m.stream(Request([UserMessage("x")])))) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    break
        # The model is still usable, and closing it leaves nothing open (warnings are errors).
        assert (await m.complete(Request([UserMessage("y")]))).finish_reason == "stop"
