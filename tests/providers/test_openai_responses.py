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
    UsageError,
)
from sunroom.providers import (
    Done,
    Message,
    OpenAIResponsesModel,
    OutputSchema,
    Request,
    RetryPolicy,
    Settings,
    SystemMessage,
    TextDelta,
    ToolCallComplete,
    ToolCallDelta,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

from .conftest import FakeTime, collect
from .replay import ReplayServer, Reply, json_reply, load, reply_from

PATH = "/v1/responses"
CAPITAL = ToolSpec(
    "get_capital",
    parameters={
        "type": "object",
        "properties": {"country": {"type": "string"}},
        "required": ["country"],
        "additionalProperties": False,
    },
    strict=True,
)
NO_RETRY = RetryPolicy(max_attempts=1)


@pytest.fixture
async def model(server: ReplayServer, fake_time: FakeTime) -> AsyncIterator[OpenAIResponsesModel]:
    m = OpenAIResponsesModel(
        "gpt-4o", api_key="sk-test", base_url=server.url + "/v1", clock=fake_time.clock
    )
    yield m
    await m.aclose()


def ask(text: str = "hello", **kw: object) -> Request:
    return Request([UserMessage(text)], **kw)  # type: ignore[arg-type]


async def test_text(server: ReplayServer, model: OpenAIResponsesModel) -> None:
    server.add(PATH, reply_from("openai/responses_text"))
    response = await model.complete(
        Request(
            [SystemMessage("Answer briefly."), UserMessage("What is the capital of France?")],
            settings=Settings(temperature=0.5, max_output_tokens=100),
        )
    )
    assert response.text == "The capital of France is Paris."
    assert response.finish_reason == "stop"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (14, 8)
    # gpt-4o: $2.5 in, $10 out per MTok
    assert response.cost_micro_usd == 14 * 2.5 + 8 * 10 == 115
    body = server.requests[-1].json()
    assert body["instructions"] == "Answer briefly."
    assert body["input"] == [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "What is the capital of France?"}],
        }
    ]
    assert (body["temperature"], body["max_output_tokens"]) == (0.5, 100)
    assert server.requests[-1].headers["authorization"] == "Bearer sk-test"


async def test_text_stream(server: ReplayServer, model: OpenAIResponsesModel) -> None:
    server.add(PATH, reply_from("openai/responses_text_stream"))
    events = await collect(model.stream(ask("What is 2+2?")))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["2", "+", "2", " =", " ", "4"]
    done = events[-1]
    assert isinstance(done, Done)
    assert done.response.text == "2+2 = 4"
    assert done.response.finish_reason == "stop"
    assert done.response.usage.input_tokens > 0
    assert done.response.model == "gpt-5.2-2025-12-11"
    assert done.response.cost_micro_usd is not None  # gpt-5.2 is in the table


async def test_function_call_and_followup(
    server: ReplayServer, model: OpenAIResponsesModel
) -> None:
    server.add(PATH, reply_from("openai/responses_function_call"))
    server.add(PATH, reply_from("openai/responses_function_call_output_followup"))
    first = await model.complete(ask("What is the capital of PotatoLand?", tools=[CAPITAL]))
    assert first.finish_reason == "tool_use"
    (call,) = first.tool_calls
    assert (call.id, call.name, call.arguments) == (
        "call_YfwRsW8sUxDKipwyhWTzOXCA",
        "get_capital",
        {"country": "PotatoLand"},
    )
    tools = server.requests[-1].json()["tools"]
    assert tools == [
        {
            "type": "function",
            "name": "get_capital",
            "description": "",
            "parameters": dict(CAPITAL.parameters),
            "strict": True,
        }
    ]
    transcript: list[Message] = [UserMessage("What is the capital of PotatoLand?"), first.message]
    transcript.append(ToolResultMessage(call.id, "Potato City"))
    second = await model.complete(Request(transcript, tools=[CAPITAL]))
    assert second.text == "The capital of PotatoLand is Potato City."
    items = server.requests[-1].json()["input"]
    assert items[1] == {
        "type": "function_call",
        "call_id": call.id,
        "name": "get_capital",
        "arguments": '{"country": "PotatoLand"}',
        "id": "fc_04907f5d3de791830068fbaa1b310c81958dc9c508e878c632",
    }
    assert items[2] == {"type": "function_call_output", "call_id": call.id, "output": "Potato City"}


async def test_function_call_stream_with_reasoning(
    server: ReplayServer, model: OpenAIResponsesModel
) -> None:
    server.add(PATH, reply_from("openai/responses_function_call_stream"))
    events = await collect(model.stream(ask("Calculate 100 * 200 / 3", tools=[CAPITAL])))
    deltas = [e.arguments_delta for e in events if isinstance(e, ToolCallDelta)]
    assert deltas == ["", '{"', "result", '":', "666", "6", "}"]  # "6666" split mid-number
    (complete,) = [e for e in events if isinstance(e, ToolCallComplete)]
    assert complete.call.arguments == {"result": 6666}
    done = events[-1]
    assert isinstance(done, Done)
    response = done.response
    assert response.finish_reason == "tool_use"
    (thought,) = response.thinking
    assert thought.origin is not None and thought.origin.item_id is not None
    assert thought.origin.item_id.startswith("rs_")
    assert thought.origin.signature is not None
    assert thought.origin.signature.startswith("gAAAAAB")  # the final encrypted content
    assert response.usage.reasoning_tokens > 0
    assert response.usage.output_tokens == 469
    # The reasoning item is replayed in place, followed by the call with its item id.
    server.add(PATH, reply_from("openai/responses_text"))
    transcript: list[Message] = [UserMessage("Calculate"), response.message]
    transcript.append(ToolResultMessage(complete.call.id, "ok"))
    await model.complete(Request(transcript))
    items = server.requests[-1].json()["input"]
    assert items[1]["type"] == "reasoning" and items[1]["id"] == thought.origin.item_id
    assert items[1]["encrypted_content"] == thought.origin.signature
    assert items[2]["type"] == "function_call" and items[2]["id"].startswith("fc_")


async def test_text_and_function_call_stream(
    server: ReplayServer, model: OpenAIResponsesModel
) -> None:
    server.add(PATH, reply_from("openai/responses_text_and_function_call_stream"))
    events = await collect(model.stream(ask("capital of PotatoLand?", tools=[CAPITAL])))
    done = events[-1]
    assert isinstance(done, Done)
    kinds = [type(p).__name__ for p in done.response.message.content]
    assert kinds == ["ThinkingPart", "TextPart", "ToolCall"]
    assert (
        done.response.text == "I\u2019ll check the capital lookup tool for \u201cPotatoLand.\u201d"
    )
    assert done.response.tool_calls[0].arguments == {"country": "PotatoLand"}


async def test_structured_output(server: ReplayServer, model: OpenAIResponsesModel) -> None:
    server.add(PATH, reply_from("openai/responses_structured_output"))
    fmt = load("openai/responses_structured_output")["request"]["body"]["text"]["format"]
    schema = OutputSchema(fmt["schema"], name="CityLocation", strict=True)
    response = await model.complete(ask("largest city?", output_schema=schema))
    assert json.loads(response.text) == {"city": "Mexico City", "country": "Mexico"}
    sent = server.requests[-1].json()["text"]
    assert sent == {"format": fmt}


async def test_stop_sequences_are_refused(model: OpenAIResponsesModel) -> None:
    with pytest.raises(UsageError, match="stop"):
        await model.complete(ask(settings=Settings(stop=("END",))))


async def test_count_tokens(server: ReplayServer, model: OpenAIResponsesModel) -> None:
    # Documented response of POST /v1/responses/input_tokens.
    server.add(
        PATH + "/input_tokens",
        json_reply(200, {"object": "response.input_tokens", "input_tokens": 11}),
    )
    assert await model.count_tokens(ask("hi")) == 11


def _error(
    status: int, message: str, kind: str, code: str | None, headers: dict[str, str] | None = None
) -> Reply:
    # OpenAI's documented error shape.
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json_reply(status, body, headers)


async def test_bad_request_recorded_on_stream(
    server: ReplayServer, model: OpenAIResponsesModel
) -> None:
    server.add(PATH, reply_from("openai/responses_error_400"))
    with pytest.raises(BadRequestError, match="temperature") as info:
        await collect(model.stream(ask(settings=Settings(temperature=-1))))
    assert info.value.status_code == 400
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (
            _error(
                401,
                "Incorrect API key provided: sk-test.",
                "invalid_request_error",
                "invalid_api_key",
            ),
            AuthenticationError,
        ),
        (
            _error(
                429,
                "Rate limit reached for gpt-4o on tokens per min (TPM). Please try again in 2s.",
                "tokens",
                "rate_limit_exceeded",
                {"retry-after-ms": "2000"},
            ),
            RateLimitedError,
        ),
        (
            _error(
                429, "You exceeded your current quota.", "insufficient_quota", "insufficient_quota"
            ),
            ProviderError,
        ),
        (
            _error(
                500, "The server had an error while processing your request.", "server_error", None
            ),
            OverloadedError,
        ),
        (
            _error(
                503,
                "The engine is currently overloaded, please try again later.",
                "server_error",
                None,
            ),
            OverloadedError,
        ),
        (
            _error(
                400,
                "Your input exceeds the context window of this model.",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            ContextTooLongError,
        ),
    ],
)
async def test_error_classes(server: ReplayServer, reply: Reply, error: type[Exception]) -> None:
    server.add(PATH, reply)
    async with OpenAIResponsesModel(
        "gpt-4o", api_key="k", base_url=server.url + "/v1", retry=NO_RETRY
    ) as m:
        with pytest.raises(ProviderError) as info:
            await m.complete(ask())
    assert type(info.value) is error
    if isinstance(info.value, RateLimitedError):
        assert info.value.retry_after == 2.0


async def test_failed_response_in_stream(server: ReplayServer, model: OpenAIResponsesModel) -> None:
    recorded = reply_from("openai/responses_text_stream")
    blocks = recorded.body.split("\n\n")
    created = json.loads(blocks[0].split("data: ", 1)[1])
    failed = dict(created["response"], status="failed")
    failed["error"] = {
        "code": "server_error",
        "message": "The model failed to generate a response.",
    }
    event = {"type": "response.failed", "sequence_number": 2, "response": failed}
    recorded.body = blocks[0] + "\n\n" + f"event: response.failed\ndata: {json.dumps(event)}\n\n"
    server.add(PATH, recorded)
    with pytest.raises(OverloadedError, match="failed to generate"):
        await collect(model.stream(ask()))


async def test_error_event_in_stream(server: ReplayServer, model: OpenAIResponsesModel) -> None:
    recorded = reply_from("openai/responses_text_stream")
    first = recorded.body.split("\n\n")[0]
    error = {
        "type": "error",
        "code": "rate_limit_exceeded",
        "message": "Slow down",
        "param": None,
        "sequence_number": 1,
    }
    recorded.body = first + "\n\n" + f"event: error\ndata: {json.dumps(error)}\n\n"
    server.add(PATH, recorded)
    with pytest.raises(RateLimitedError, match="Slow down"):
        await collect(model.stream(ask()))


async def test_retry_then_success(server: ReplayServer, fake_time: FakeTime) -> None:
    server.add(PATH, _error(503, "overloaded", "server_error", None), times=2)
    server.add(PATH, reply_from("openai/responses_text"))
    async with OpenAIResponsesModel(
        "gpt-4o", api_key="k", base_url=server.url + "/v1", clock=fake_time.clock
    ) as m:
        response = await m.complete(ask())
    assert response.text == "The capital of France is Paris."
    assert len(server.requests) == 3
    assert fake_time.sleeps == [0.375, 0.75]  # equal jitter with draw 0.5: 0.5*(0.5..1), 1*(..)


async def test_stream_cut_midway(server: ReplayServer, model: OpenAIResponsesModel) -> None:
    server.add(PATH, reply_from("openai/responses_text_stream", mode="cut", cut_after=6))
    seen: list[object] = []
    with pytest.raises(ProviderConnectionError):
        await collect(model.stream(ask()), into=seen)
    assert any(isinstance(e, TextDelta) for e in seen)


async def test_hanging_server_times_out(server: ReplayServer) -> None:
    server.add(PATH, reply_from("openai/responses_text", mode="hang"))
    async with OpenAIResponsesModel(
        "gpt-4o", api_key="k", base_url=server.url + "/v1", retry=NO_RETRY
    ) as m:
        with pytest.raises(ProviderTimeoutError):
            await m.complete(ask(settings=Settings(timeout=0.2)))


def test_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(AuthenticationError, match="OPENAI_API_KEY"):
        OpenAIResponsesModel("gpt-4o")
