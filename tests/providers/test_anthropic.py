from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest

from sunroom.errors import (
    AuthenticationError,
    BadRequestError,
    ContextTooLongError,
    OverloadedError,
    ProviderConnectionError,
    ProviderTimeoutError,
    RateLimitedError,
)
from sunroom.providers import (
    AnthropicModel,
    AssistantMessage,
    Done,
    Message,
    OutputSchema,
    Request,
    RetryPolicy,
    Settings,
    SystemMessage,
    TextDelta,
    ThinkingDelta,
    ThinkingPart,
    ToolCall,
    ToolCallComplete,
    ToolCallDelta,
    ToolResultMessage,
    ToolSpec,
    UsageUpdate,
    UserMessage,
)

from .conftest import FakeTime, collect
from .replay import ReplayServer, Reply, json_reply, load, reply_from

PATH = "/v1/messages"
# A configured name no SDK release will list as deprecated (the anthropic SDK warns on those,
# and warnings are errors here); prices follow the model the recorded reply names.
NAME = "claude-replay-test"
WEATHER = ToolSpec(
    "get_weather",
    "Lookup the weather for a given city",
    {
        "type": "object",
        "properties": {"location": {"type": "string"}, "units": {"enum": ["c", "f"]}},
        "required": ["location", "units"],
    },
)


@pytest.fixture
async def model(server: ReplayServer, fake_time: FakeTime) -> AsyncIterator[AnthropicModel]:
    m = AnthropicModel(NAME, api_key="sk-ant-test", base_url=server.url, clock=fake_time.clock)
    yield m
    await m.aclose()


def ask(text: str = "hello", **kw: object) -> Request:
    return Request([UserMessage(text)], **kw)  # type: ignore[arg-type]


async def test_text(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_text"))
    response = await model.complete(
        Request(
            [SystemMessage("be brief"), UserMessage("hello")],
            settings=Settings(temperature=0.2, max_output_tokens=4096),
        )
    )
    assert response.text == "Hello! \U0001f44b How can I help you today?"
    assert response.finish_reason == "stop"
    assert response.raw_finish_reason == "end_turn"
    assert response.model == "claude-haiku-4-5-20251001"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (8, 16)
    # claude-haiku-4-5: $1 / $5 per MTok -> 8 * 1 + 16 * 5 micro-USD
    assert response.cost_micro_usd == 88
    body = server.requests[-1].json()
    assert body["model"] == NAME
    assert body["system"] == "be brief"
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 4096
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    headers = server.requests[-1].headers
    assert "sk-ant-test" in (headers.get("x-api-key"), headers.get("authorization", "")[7:])


async def test_text_stream(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_text_stream"))
    events = await collect(model.stream(ask("What is 1+1?")))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["2"]
    assert isinstance(events[0], UsageUpdate)
    done = events[-1]
    assert isinstance(done, Done)
    assert done.response.text == "2"
    assert done.response.usage.output_tokens == 5
    assert done.response.model == "claude-sonnet-4-5-20250929"
    assert server.requests[-1].json()["stream"] is True


async def test_tool_call(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_tool_use"))
    response = await model.complete(
        ask("weather in SF?", tools=[WEATHER], settings=Settings(tool_choice="required"))
    )
    assert response.finish_reason == "tool_use"
    (call,) = response.tool_calls
    assert call.name == "get_weather"
    assert call.id.startswith("toolu_")
    recorded = json.loads(load("anthropic/messages_tool_use")["response"]["body"])
    assert call.arguments == recorded["content"][-1]["input"]
    body = server.requests[-1].json()
    assert body["tools"][0]["name"] == "get_weather"
    assert body["tools"][0]["input_schema"]["required"] == ["location", "units"]
    assert body["tool_choice"] == {"type": "any"}


async def test_tool_call_stream_split_mid_token(
    server: ReplayServer, model: AnthropicModel
) -> None:
    server.add(PATH, reply_from("anthropic/messages_tool_use_stream"))
    events = await collect(model.stream(ask("weather in SF?", tools=[WEATHER])))
    deltas = [e.arguments_delta for e in events if isinstance(e, ToolCallDelta)]
    assert "loca" in deltas and "tio" in deltas  # split inside the key "location"
    assert json.loads("".join(deltas)) == {"location": "San Francisco, CA", "units": "f"}
    (complete,) = [e for e in events if isinstance(e, ToolCallComplete)]
    assert complete.call.arguments == {"location": "San Francisco, CA", "units": "f"}
    done = events[-1]
    assert isinstance(done, Done)
    assert done.response.finish_reason == "tool_use"
    assert done.response.tool_calls == (complete.call,)
    assert done.response.usage.output_tokens == 74


async def test_text_then_tool_stream(server: ReplayServer, model: AnthropicModel) -> None:
    reply = reply_from("anthropic/messages_text_then_tool_use_stream")
    reply.body += "\n\n"  # the recording lacks the final blank line (see data/README.md)
    server.add(PATH, reply)
    events = await collect(model.stream(ask("weather in Paris?", tools=[WEATHER])))
    done = events[-1]
    assert isinstance(done, Done)
    assert done.response.text == "I'll check the current weather in Paris for you."
    assert done.response.tool_calls[0].arguments == {"location": "Paris"}
    kinds = [type(p).__name__ for p in done.response.message.content]
    assert kinds == ["TextPart", "ToolCall"]


async def test_parallel_tool_calls(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_parallel_tool_use"))
    response = await model.complete(ask("many things"))
    assert len(response.tool_calls) == 4
    assert len({c.id for c in response.tool_calls}) == 4
    assert response.text


async def test_truncated_tool_input_stream(server: ReplayServer, model: AnthropicModel) -> None:
    reply = reply_from("anthropic/messages_max_tokens_partial_tool_input_stream")
    reply.body += "\n\n"
    server.add(PATH, reply)
    events = await collect(model.stream(ask("write a tax guide")))
    done = events[-1]
    assert isinstance(done, Done)
    assert done.response.finish_reason == "length"
    (call,) = done.response.tool_calls
    assert call.name == "make_file"
    assert call.arguments == {}
    assert call.raw_arguments is not None and call.raw_arguments.startswith('{"filename"')


async def test_thinking_round_trip(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_thinking_tool_use"))
    server.add(PATH, reply_from("anthropic/messages_tool_result_followup"))
    tool = ToolSpec("get_user_country")
    thinking = Settings(extra_body={"thinking": {"type": "enabled", "budget_tokens": 3000}})
    first = await model.complete(ask("largest city?", tools=[tool], settings=thinking))
    (thought,) = first.thinking
    assert thought.text.startswith("The user is asking")
    assert thought.origin is not None and thought.origin.signature is not None
    assert thought.origin.signature.startswith("EqEE")
    (call,) = first.tool_calls
    transcript: list[Message] = [
        UserMessage("largest city?"),
        first.message,
        ToolResultMessage(call.id, "Mexico"),
    ]
    await model.complete(Request(transcript, tools=[tool], settings=thinking))
    sent = server.requests[-1].json()
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 3000}
    assistant = sent["messages"][1]["content"]
    assert assistant[0] == {
        "type": "thinking",
        "thinking": thought.text,
        "signature": thought.origin.signature,
    }
    assert assistant[2] == {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
    assert sent["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "Mexico", "is_error": False}
        ],
    }


async def test_foreign_thinking_is_not_replayed(
    server: ReplayServer, model: AnthropicModel
) -> None:
    server.add(PATH, reply_from("anthropic/messages_text"))
    from sunroom.providers import Origin, TextPart

    other = AssistantMessage(
        [ThinkingPart("hmm", Origin("openai", item_id="rs_1", signature="x")), TextPart("hi")]
    )
    await model.complete(Request([UserMessage("a"), other, UserMessage("b")]))
    sent = server.requests[-1].json()["messages"][1]
    assert sent == {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}


async def test_thinking_stream(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_thinking_stream"))
    events = await collect(model.stream(ask("How do I cross the street?")))
    thought = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    done = events[-1]
    assert isinstance(done, Done)
    (part,) = done.response.thinking
    assert part.text == thought and thought
    assert part.origin is not None and part.origin.signature  # from signature_delta
    assert done.response.text.startswith("Here are the basic steps")


async def test_structured_output(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_structured_output"))
    schema = load("anthropic/messages_structured_output")["request"]["body"]["output_config"]
    schema = schema["format"]["schema"]
    response = await model.complete(
        ask("order", output_schema=OutputSchema(schema, name="OrderItem"))
    )
    assert json.loads(response.text) == {"product_name": "Green Tea", "price": 5.5, "quantity": 2}
    sent = server.requests[-1].json()
    assert sent["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


async def test_structured_output_stream(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_structured_output_stream"))
    events = await collect(
        model.stream(ask("order", output_schema=OutputSchema({"type": "object"})))
    )
    done = events[-1]
    assert isinstance(done, Done)
    assert len([e for e in events if isinstance(e, TextDelta)]) > 1
    assert json.loads(done.response.text) == [12345, 67890]


async def test_cache_usage_and_cost(server: ReplayServer, model: AnthropicModel) -> None:
    body = json.loads(load("anthropic/messages_text")["response"]["body"])
    body["usage"].update(
        input_tokens=10,
        cache_read_input_tokens=1000,
        cache_creation_input_tokens=300,
        cache_creation={"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 100},
    )
    server.add(PATH, json_reply(200, body))
    response = await model.complete(ask())
    usage = response.usage
    assert usage.input_tokens == 1310
    assert (usage.cache_read_tokens, usage.cache_write_tokens, usage.cache_write_1h_tokens) == (
        1000,
        300,
        100,
    )
    # haiku 4.5: in 1, out 5, read 0.1, 5m write 1.25, 1h write 2 (micro-USD per token)
    assert response.cost_micro_usd == round(10 * 1 + 16 * 5 + 1000 * 0.1 + 200 * 1.25 + 100 * 2)


async def test_unknown_model_costs_none(server: ReplayServer) -> None:
    body = json.loads(load("anthropic/messages_text")["response"]["body"])
    body["model"] = "my-finetune"
    server.add(PATH, json_reply(200, body))
    async with AnthropicModel("my-finetune", api_key="k", base_url=server.url) as m:
        response = await m.complete(ask())
    assert response.cost_micro_usd is None
    assert response.usage.output_tokens == 16


async def test_count_tokens(server: ReplayServer, model: AnthropicModel) -> None:
    # Documented response shape of POST /v1/messages/count_tokens.
    server.add(PATH + "/count_tokens", json_reply(200, {"input_tokens": 14}))
    assert await model.count_tokens(ask("hello", tools=[WEATHER])) == 14
    sent = server.requests[-1].json()
    assert "max_tokens" not in sent and sent["tools"][0]["name"] == "get_weather"


# --- errors -------------------------------------------------------------------------------

NO_RETRY = RetryPolicy(max_attempts=1)


def _error(kind: str, message: str, status: int, headers: dict[str, str] | None = None) -> Reply:
    # Anthropic's documented error shape: {"type":"error","error":{"type","message"},"request_id"}
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"}
    return json_reply(status, body, headers)


async def test_rate_limited_recorded(server: ReplayServer) -> None:
    server.add(PATH, reply_from("anthropic/error_429_rate_limit"))
    async with AnthropicModel(NAME, api_key="k", base_url=server.url, retry=NO_RETRY) as m:
        with pytest.raises(RateLimitedError) as info:
            await m.complete(ask())
    assert info.value.status_code == 429
    assert info.value.provider == "anthropic"
    assert "rate limit" in str(info.value)
    assert info.value.body["error"]["type"] == "rate_limit_error"


async def test_rate_limited_stream_request(server: ReplayServer) -> None:
    server.add(PATH, reply_from("anthropic/error_429_rate_limit_stream_request"))
    async with AnthropicModel(NAME, api_key="k", base_url=server.url, retry=NO_RETRY) as m:
        with pytest.raises(RateLimitedError):
            await collect(m.stream(ask()))


async def test_retry_after_is_honoured(server: ReplayServer, fake_time: FakeTime) -> None:
    server.add(PATH, _error("rate_limit_error", "slow down", 429, {"retry-after": "7"}))
    server.add(PATH, reply_from("anthropic/messages_text"))
    async with AnthropicModel(NAME, api_key="k", base_url=server.url, clock=fake_time.clock) as m:
        response = await m.complete(ask())
    assert response.text.startswith("Hello")
    assert fake_time.sleeps == [7.0]
    assert len(server.requests) == 2


async def test_bad_request_not_retried(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/error_400_invalid_request"))
    with pytest.raises(BadRequestError) as info:
        await model.complete(ask())
    assert not isinstance(info.value, ContextTooLongError)
    assert info.value.status_code == 400
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (_error("authentication_error", "invalid x-api-key", 401), AuthenticationError),
        (_error("permission_error", "no access to this model", 403), AuthenticationError),
        (_error("overloaded_error", "Overloaded", 529), OverloadedError),
        (_error("api_error", "Internal server error", 500), OverloadedError),
        (_error("not_found_error", "model: claude-nope", 404), BadRequestError),
        (
            _error(
                "invalid_request_error", "prompt is too long: 215234 tokens > 200000 maximum", 400
            ),
            ContextTooLongError,
        ),
    ],
)
async def test_error_classes(server: ReplayServer, reply: Reply, error: type[Exception]) -> None:
    server.add(PATH, reply)
    async with AnthropicModel(NAME, api_key="k", base_url=server.url, retry=NO_RETRY) as m:
        with pytest.raises(error) as info:
            await m.complete(ask())
    assert type(info.value) is error


async def test_error_event_mid_stream(server: ReplayServer, model: AnthropicModel) -> None:
    recorded = reply_from("anthropic/messages_text_stream")
    head = recorded.body.split("event: content_block_delta")[0]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    recorded.body = head + f"event: error\ndata: {json.dumps(error)}\n\n"
    server.add(PATH, recorded)
    with pytest.raises(OverloadedError):
        await collect(model.stream(ask()))


async def test_stream_cut_midway(server: ReplayServer, model: AnthropicModel) -> None:
    server.add(PATH, reply_from("anthropic/messages_tool_use_stream", mode="cut", cut_after=6))
    seen: list[object] = []
    with pytest.raises(ProviderConnectionError):
        await collect(model.stream(ask()), into=seen)
    assert any(isinstance(e, ToolCallDelta) for e in seen)  # got part of it first
    assert not any(isinstance(e, Done) for e in seen)


async def test_stream_ending_without_message_stop(
    server: ReplayServer, model: AnthropicModel
) -> None:
    # The recording has no final blank line, so its message_stop is never dispatched.
    server.add(PATH, reply_from("anthropic/messages_text_then_tool_use_stream"))
    with pytest.raises(ProviderConnectionError, match="ended before"):
        await collect(model.stream(ask()))


async def test_hanging_server_times_out(server: ReplayServer) -> None:
    server.add(PATH, reply_from("anthropic/messages_text", mode="hang"))
    async with AnthropicModel(
        NAME,
        api_key="k",
        base_url=server.url,
        retry=NO_RETRY,
        settings=Settings(timeout=0.2),
    ) as m:
        start = time.monotonic()
        with pytest.raises(ProviderTimeoutError):
            await m.complete(ask())
        assert time.monotonic() - start < 2


async def test_hanging_stream_times_out(server: ReplayServer) -> None:
    server.add(PATH, reply_from("anthropic/messages_text_stream", mode="hang"))
    async with AnthropicModel(NAME, api_key="k", base_url=server.url, retry=NO_RETRY) as m:
        with pytest.raises(ProviderTimeoutError):
            await collect(m.stream(ask(settings=Settings(timeout=0.2))))


def test_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(AuthenticationError, match="ANTHROPIC_API_KEY"):
        AnthropicModel(NAME)


def test_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret-value")
    m = AnthropicModel(NAME)
    assert m.config.api_key == "sk-ant-secret-value"
    assert "sk-ant-secret-value" not in repr(m)


async def test_tool_result_error_and_image(server: ReplayServer, model: AnthropicModel) -> None:
    from sunroom.providers import ImagePart

    server.add(PATH, reply_from("anthropic/messages_text"))
    call = ToolCall("toolu_1", "f", {"x": 1})
    await model.complete(
        Request(
            [
                UserMessage(
                    [
                        ImagePart(b"\x89PNG", media_type="image/png"),
                        ImagePart(url="https://x/y.jpg"),
                    ]
                ),
                AssistantMessage([call]),
                ToolResultMessage("toolu_1", "boom", is_error=True),
            ]
        )
    )
    sent = server.requests[-1].json()["messages"]
    assert sent[0]["content"][0]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": "iVBORw==",
    }
    assert sent[0]["content"][1]["source"] == {"type": "url", "url": "https://x/y.jpg"}
    assert sent[2]["content"][0]["is_error"] is True
