from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from sunroom.errors import (
    AuthenticationError,
    BadRequestError,
    ContextTooLongError,
    OverloadedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitedError,
)
from sunroom.providers import (
    DEFAULT_PRICES,
    AssistantMessage,
    Done,
    ImagePart,
    Message,
    OpenAIChatModel,
    OutputSchema,
    Price,
    Request,
    RetryPolicy,
    Settings,
    SystemMessage,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallDelta,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

from .conftest import FakeTime, collect
from .replay import ReplayServer, Reply, json_reply, load, reply_from

PATH = "/v1/chat/completions"
WEATHER = ToolSpec(
    "get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "state": {"type": "string"}},
        "required": ["city", "state"],
        "additionalProperties": False,
    },
    strict=True,
)
NO_RETRY = RetryPolicy(max_attempts=1)


@pytest.fixture
async def model(server: ReplayServer, fake_time: FakeTime) -> AsyncIterator[OpenAIChatModel]:
    m = OpenAIChatModel("gpt-4o-2024-08-06", base_url=server.url + "/v1", clock=fake_time.clock)
    yield m
    await m.aclose()


def ask(text: str = "What's the weather like in SF?", **kw: object) -> Request:
    return Request([UserMessage(text)], **kw)  # type: ignore[arg-type]


async def test_text(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_text"))
    response = await model.complete(
        Request(
            [SystemMessage("be kind"), UserMessage("What's the weather like in SF?")],
            settings=Settings(temperature=0, max_output_tokens=50, stop=("\n\n",)),
        )
    )
    assert response.text.startswith("I'm unable to provide real-time weather")
    assert response.finish_reason == "stop"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (14, 37)
    assert response.cost_micro_usd is None  # a custom base_url has no default prices
    body = server.requests[-1].json()
    assert body["messages"] == [
        {"role": "system", "content": "be kind"},
        {"role": "user", "content": "What's the weather like in SF?"},
    ]
    assert (body["temperature"], body["max_tokens"], body["stop"]) == (0, 50, ["\n\n"])


async def test_text_stream(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_text_stream"))
    events = await collect(model.stream(ask()))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    done = events[-1]
    assert isinstance(done, Done)
    assert done.response.text == text and text.startswith("I'm unable")
    assert done.response.usage.input_tokens == 14  # from the final usage chunk
    sent = server.requests[-1].json()
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_tool_call_and_followup(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_tool_call"))
    server.add(PATH, reply_from("openai/chat_text"))
    first = await model.complete(ask(tools=[WEATHER], settings=Settings(tool_choice="get_weather")))
    assert first.finish_reason == "tool_use"
    (call,) = first.tool_calls
    assert call.arguments == {"city": "San Francisco", "state": "CA"}
    sent = server.requests[-1].json()
    assert sent["tools"][0]["function"]["strict"] is True
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    transcript: list[Message] = [
        UserMessage("weather?"),
        first.message,
        ToolResultMessage(call.id, "sunny"),
    ]
    await model.complete(Request(transcript, tools=[WEATHER]))
    messages = server.requests[-1].json()["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(call.arguments)},
            }
        ],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}


async def test_tool_call_stream(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_tool_call_stream"))
    events = await collect(model.stream(ask(tools=[WEATHER])))
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].arguments_delta == "" and deltas[0].name == "get_weather"
    (complete,) = [e for e in events if isinstance(e, ToolCallComplete)]
    assert complete.call.arguments == json.loads("".join(d.arguments_delta for d in deltas))
    done = events[-1]
    assert isinstance(done, Done) and done.response.finish_reason == "tool_use"


async def test_parallel_tool_calls_stream(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_parallel_tool_calls_stream"))
    events = await collect(model.stream(ask()))
    completes = [e for e in events if isinstance(e, ToolCallComplete)]
    assert [c.index for c in completes] == [0, 1]
    assert completes[0].call.arguments == {"city": "Edinburgh", "country": "GB", "units": "c"}
    assert completes[1].call.name == "get_stock_price"
    split = [e.arguments_delta for e in events if isinstance(e, ToolCallDelta) and e.index == 0]
    assert '{"ci' in split  # "city" split mid-token


async def test_structured_output(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_structured_output"))
    fmt = load("openai/chat_structured_output")["request"]["body"]["response_format"]
    schema = OutputSchema(fmt["json_schema"]["schema"], name="Location", strict=True)
    response = await model.complete(ask(output_schema=schema))
    assert json.loads(response.text) == {"city": "San Francisco", "temperature": 65, "units": "f"}
    assert server.requests[-1].json()["response_format"] == fmt


async def test_structured_output_stream(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_structured_output_stream"))
    events = await collect(model.stream(ask(output_schema=OutputSchema({"type": "object"}))))
    done = events[-1]
    assert isinstance(done, Done)
    assert json.loads(done.response.text)["city"] == "San Francisco"


async def test_prices_for_a_local_model(server: ReplayServer) -> None:
    server.add(PATH, reply_from("openai/chat_text"), times=2)
    table = DEFAULT_PRICES.with_prices({"openai-compatible:gpt-4o": Price(input=1, output=2)})
    async with OpenAIChatModel("gpt-4o", base_url=server.url + "/v1", prices=table) as m:
        assert (await m.complete(ask())).cost_micro_usd == 14 * 1 + 37 * 2
    async with OpenAIChatModel(
        "x", base_url=server.url + "/v1", price=Price(input=0, output=0)
    ) as m:
        assert (await m.complete(ask())).cost_micro_usd == 0


async def test_reasoning_content_and_images(server: ReplayServer, model: OpenAIChatModel) -> None:
    # vLLM / llama.cpp / DeepSeek put reasoning in a non-standard `reasoning_content` field.
    body = json.loads(load("openai/chat_text")["response"]["body"])
    body["choices"][0]["message"]["reasoning_content"] = "The user wants weather."
    server.add(PATH, json_reply(200, body))
    response = await model.complete(
        Request([UserMessage(["look", ImagePart(b"GIF89a", media_type="image/gif")])])
    )
    assert response.thinking[0].text == "The user wants weather."
    content = server.requests[-1].json()["messages"][0]["content"]
    assert content[1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/gif;base64,R0lGODlh"},
    }


async def test_reasoning_content_stream(server: ReplayServer, model: OpenAIChatModel) -> None:
    chunk = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen3",
        "choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}, "finish_reason": None}],
    }
    last = dict(chunk, choices=[{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}])
    body = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(last)}\n\ndata: [DONE]\n\n"
    server.add(PATH, Reply(headers={"content-type": "text/event-stream"}, body=body))
    events = await collect(model.stream(ask()))
    assert [type(e) for e in events] == [ThinkingDelta, TextDelta, Done]
    done = events[-1]
    assert isinstance(done, Done) and done.response.thinking[0].text == "hmm"


def _error(status: int, message: str, kind: str, code: str | None) -> Reply:
    return json_reply(
        status, {"error": {"message": message, "type": kind, "param": None, "code": code}}
    )


async def test_bad_request_recorded(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_error_400"))
    with pytest.raises(BadRequestError, match="does not support 'system'") as info:
        await model.complete(ask())
    assert info.value.body["code"] == "unsupported_value"  # the SDK unwraps "error"


async def test_openrouter_rate_limit_recorded(server: ReplayServer, fake_time: FakeTime) -> None:
    server.add(PATH, reply_from("openrouter/chat_error_429"), times=None)
    async with OpenAIChatModel(
        "google/gemini-2.0-flash-exp:free", base_url=server.url + "/v1", clock=fake_time.clock
    ) as m:
        with pytest.raises(RateLimitedError, match="Provider returned error") as info:
            await m.complete(ask())
    assert info.value.retry_after is None  # OpenRouter sent no retry-after
    assert len(server.requests) == 4  # retried up to max_attempts
    assert len(fake_time.sleeps) == 3


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (
            _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
            AuthenticationError,
        ),
        (_error(502, "Bad gateway.", "server_error", None), OverloadedError),
        (
            _error(
                400,
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            ContextTooLongError,
        ),
    ],
)
async def test_error_classes(server: ReplayServer, reply: Reply, error: type[Exception]) -> None:
    server.add(PATH, reply)
    async with OpenAIChatModel("m", base_url=server.url + "/v1", retry=NO_RETRY) as m:
        with pytest.raises(ProviderError) as info:
            await m.complete(ask())
    assert type(info.value) is error


async def test_stream_cut_midway(server: ReplayServer, model: OpenAIChatModel) -> None:
    server.add(PATH, reply_from("openai/chat_tool_call_stream", mode="cut", cut_after=4))
    with pytest.raises(ProviderConnectionError):
        await collect(model.stream(ask()))


async def test_stream_without_finish_is_cut(server: ReplayServer, model: OpenAIChatModel) -> None:
    # A server that closes the stream cleanly but never says why the reply ended.
    body = reply_from("openai/chat_text_stream").body.split("\n\n")[:3]
    server.add(
        PATH, Reply(headers={"content-type": "text/event-stream"}, body="\n\n".join(body) + "\n\n")
    )
    with pytest.raises(ProviderConnectionError, match="ended before"):
        await collect(model.stream(ask()))


async def test_hanging_server_times_out(server: ReplayServer) -> None:
    server.add(PATH, reply_from("openai/chat_text", mode="hang"))
    async with OpenAIChatModel("m", base_url=server.url + "/v1", retry=NO_RETRY) as m:
        with pytest.raises(ProviderTimeoutError):
            await m.complete(ask(settings=Settings(timeout=0.2)))


async def test_connection_refused(fake_time: FakeTime) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    async with OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", retry=NO_RETRY) as m:
        with pytest.raises(ProviderConnectionError):
            await m.complete(ask())


async def test_assistant_text_and_calls_round_trip(
    server: ReplayServer, model: OpenAIChatModel
) -> None:
    server.add(PATH, reply_from("openai/chat_text"))
    msg = AssistantMessage(["Let me check.", ToolCall("c1", "get_weather", {"city": "SF"})])
    await model.complete(
        Request([UserMessage("q"), msg, ToolResultMessage("c1", "bad city", is_error=True)])
    )
    sent = server.requests[-1].json()["messages"]
    assert sent[1]["content"] == "Let me check."
    assert sent[2]["content"] == "Error: bad city"


def test_placeholder_key_for_local_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    m = OpenAIChatModel("llama3", base_url="http://127.0.0.1:1/v1")
    assert m.config.api_key == "no-key"
