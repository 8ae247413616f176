from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

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
    Done,
    GeminiModel,
    ImagePart,
    Message,
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
    UsageUpdate,
    UserMessage,
)

from .conftest import FakeTime, collect
from .replay import ReplayServer, Reply, json_reply, load, reply_from

BASE = "/v1beta/models/"
CAPITAL = ToolSpec(
    "get_capital",
    "Get the capital of a country.",
    {
        "type": "object",
        "properties": {"country": {"type": "string", "description": "The country name."}},
        "required": ["country"],
        "additionalProperties": False,
    },
)
NO_RETRY = RetryPolicy(max_attempts=1)


def path(model: str, stream: bool = False) -> str:
    return BASE + model + (":streamGenerateContent" if stream else ":generateContent")


@pytest.fixture
async def model(server: ReplayServer, fake_time: FakeTime) -> AsyncIterator[GeminiModel]:
    m = GeminiModel("gemini-2.5-flash", api_key="g-key", base_url=server.url, clock=fake_time.clock)
    yield m
    await m.aclose()


def gemini(server: ReplayServer, name: str, **kw: Any) -> GeminiModel:
    return GeminiModel(name, api_key="g-key", base_url=server.url, **kw)


def ask(text: str = "Hello!", **kw: object) -> Request:
    return Request([UserMessage(text)], **kw)  # type: ignore[arg-type]


async def test_text(server: ReplayServer, model: GeminiModel) -> None:
    server.add(path("gemini-2.5-flash"), reply_from("google/generate_content_text"))
    response = await model.complete(
        Request(
            [SystemMessage("You are a chatbot."), UserMessage("Hello!")],
            settings=Settings(temperature=0.1, max_output_tokens=64, stop=("END",)),
        )
    )
    assert response.text == "Hello! How can I help you today?"
    assert response.finish_reason == "stop"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (9, 9 + 34, 34)
    # gemini-2.5-flash: $0.30 in, $2.50 out (thinking billed as output)
    assert response.cost_micro_usd == round(9 * 0.3 + 43 * 2.5)
    sent = server.requests[-1]
    assert sent.headers["x-goog-api-key"] == "g-key"
    body = sent.json()
    assert body["contents"] == [{"parts": [{"text": "Hello!"}], "role": "user"}]
    assert body["systemInstruction"]["parts"] == [{"text": "You are a chatbot."}]
    config = body["generationConfig"]
    assert (config["temperature"], config["maxOutputTokens"], config["stopSequences"]) == (
        0.1,
        64,
        ["END"],
    )


async def test_text_stream(server: ReplayServer, model: GeminiModel) -> None:
    server.add(
        path("gemini-2.5-flash", stream=True), reply_from("google/stream_generate_content_text")
    )
    events = await collect(model.stream(ask("Count from 1 to 30")))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "\n".join(str(i) for i in range(1, 31))
    usages = [e.usage.output_tokens for e in events if isinstance(e, UsageUpdate)]
    assert usages == [31 + 35, 79 + 35, 80 + 35]  # live, growing usage
    done = events[-1]
    assert isinstance(done, Done) and done.response.text == text
    assert server.requests[-1].path.endswith("?alt=sse")


async def test_function_call_round_trip(server: ReplayServer) -> None:
    server.add(path("gemini-2.5-pro"), reply_from("google/generate_content_function_call"))
    server.add(
        path("gemini-2.5-pro"), reply_from("google/generate_content_function_response_followup")
    )
    async with gemini(server, "gemini-2.5-pro") as m:
        first = await m.complete(ask("What is the capital of France?", tools=[CAPITAL]))
        assert first.finish_reason == "tool_use"
        (call,) = first.tool_calls
        assert (call.name, call.arguments) == ("get_capital", {"country": "France"})
        assert call.origin is not None and call.origin.signature is not None
        assert call.origin.signature.startswith("CpYEAXLI2nx")
        declared = server.requests[-1].json()["tools"][0]["functionDeclarations"][0]
        assert declared["name"] == "get_capital"
        # google-genai passes the schema key through in proto field-name form, as recorded.
        assert declared["parameters_json_schema"] == dict(CAPITAL.parameters)
        transcript: list[Message] = [UserMessage("What is the capital of France?"), first.message]
        transcript.append(ToolResultMessage(call.id, "Paris"))
        second = await m.complete(Request(transcript, tools=[CAPITAL]))
    assert second.text == "Paris"
    assert second.message.content[0].origin is not None  # text carried a thought signature
    contents = server.requests[-1].json()["contents"]
    model_part = contents[1]["parts"][0]
    assert model_part["functionCall"] == {
        "id": call.id,
        "name": "get_capital",
        "args": {"country": "France"},
    }
    # The same signature bytes go back (google-genai encodes bytes as URL-safe base64).
    sent = base64.urlsafe_b64decode(model_part["thoughtSignature"])
    assert sent == base64.b64decode(call.origin.signature)
    assert contents[2] == {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "id": call.id,
                    "name": "get_capital",
                    "response": {"output": "Paris"},
                }
            }
        ],
    }


async def test_function_call_stream(server: ReplayServer) -> None:
    server.add(
        path("gemini-2.0-flash", stream=True),
        reply_from("google/stream_generate_content_function_call"),
    )
    async with gemini(server, "gemini-2.0-flash") as m:
        events = await collect(
            m.stream(ask("temperature of the capital of France?", tools=[CAPITAL]))
        )
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [d.arguments_delta for d in deltas] == ["", '{"country":"France"}']  # sent whole
    (complete,) = [e for e in events if isinstance(e, ToolCallComplete)]
    assert complete.call.arguments == {"country": "France"}
    done = events[-1]
    assert isinstance(done, Done) and done.response.finish_reason == "tool_use"


async def test_function_call_stream_thought_signature(server: ReplayServer) -> None:
    reply = reply_from("google/stream_generate_content_function_call_thought_signature")
    server.add(path("gemini-3-pro-preview", stream=True), reply)
    async with gemini(server, "gemini-3-pro-preview") as m:
        events = await collect(
            m.stream(ask("capital of the user country?", tools=[ToolSpec("get_country")]))
        )
    done = events[-1]
    assert isinstance(done, Done)
    (call,) = done.response.tool_calls
    assert call.name == "get_country" and call.arguments == {}
    assert call.origin is not None and call.origin.signature is not None
    assert call.origin.signature.startswith("EpwICpkI")
    assert done.response.finish_reason == "tool_use"


async def test_structured_output(server: ReplayServer) -> None:
    server.add(path("gemini-2.0-flash"), reply_from("google/generate_content_structured_output"))
    schema = load("google/generate_content_structured_output")["request"]["body"][
        "generationConfig"
    ]
    schema = schema["responseJsonSchema"]
    async with gemini(server, "gemini-2.0-flash") as m:
        response = await m.complete(
            ask("largest city in Mexico?", output_schema=OutputSchema(schema))
        )
    assert json.loads(response.text) == {"city": "Mexico City", "country": "Mexico"}
    config = server.requests[-1].json()["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == schema


async def test_extra_body_and_tool_choice(server: ReplayServer, model: GeminiModel) -> None:
    server.add(path("gemini-2.5-flash"), reply_from("google/generate_content_text"))
    extra = {"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}
    await model.complete(
        ask(tools=[CAPITAL], settings=Settings(extra_body=extra, tool_choice="get_capital"))
    )
    body = server.requests[-1].json()
    assert body["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 0}
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_capital"]}
    }


async def test_inline_image(server: ReplayServer, model: GeminiModel) -> None:
    server.add(path("gemini-2.5-flash"), reply_from("google/generate_content_text"))
    await model.complete(Request([UserMessage(["what is this?", ImagePart(b"\x89PNG")])]))
    part = server.requests[-1].json()["contents"][0]["parts"][1]
    # Proto JSON accepts field names in either case; google-genai sends these as given.
    assert part == {"inlineData": {"mime_type": "image/png", "data": "iVBORw=="}}


async def test_count_tokens(server: ReplayServer, model: GeminiModel) -> None:
    # Documented response of POST models/{model}:countTokens.
    server.add(BASE + "gemini-2.5-flash:countTokens", json_reply(200, {"totalTokens": 31}))
    assert await model.count_tokens(ask("hello")) == 31


def _error(code: int, status: str, message: str, details: list[Any] | None = None) -> Reply:
    # The google.rpc.Status error shape the Gemini API documents.
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details is not None:
        error["details"] = details
    return json_reply(code, {"error": error})


async def test_not_found_recorded(server: ReplayServer) -> None:
    server.add(path("gemini-3.6-flahs"), reply_from("google/error_404_model_not_found"))
    async with gemini(server, "gemini-3.6-flahs") as m:
        with pytest.raises(BadRequestError, match="is not found") as info:
            await m.complete(ask())
    assert info.value.status_code == 404
    assert len(server.requests) == 1


async def test_rate_limit_with_retry_info(server: ReplayServer, fake_time: FakeTime) -> None:
    details = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests"
                }
            ],
        },
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "17s"},
    ]
    server.add(
        path("gemini-2.5-flash"),
        _error(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota.", details),
    )
    server.add(path("gemini-2.5-flash"), reply_from("google/generate_content_text"))
    async with gemini(server, "gemini-2.5-flash", clock=fake_time.clock) as m:
        response = await m.complete(ask())
    assert response.text.startswith("Hello")
    assert fake_time.sleeps == [17.0]


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (
            _error(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "API_KEY_INVALID",
                        "domain": "googleapis.com",
                    }
                ],
            ),
            AuthenticationError,
        ),
        (
            _error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
            AuthenticationError,
        ),
        (
            _error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
            RateLimitedError,
        ),
        (_error(500, "INTERNAL", "An internal error has occurred."), OverloadedError),
        (
            _error(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
            OverloadedError,
        ),
        (_error(400, "INVALID_ARGUMENT", "Request contains an invalid argument."), BadRequestError),
        (
            _error(
                400,
                "INVALID_ARGUMENT",
                "The input token count (1048577) exceeds the maximum number of tokens allowed (1048576).",
            ),
            ContextTooLongError,
        ),
    ],
)
async def test_error_classes(server: ReplayServer, reply: Reply, error: type[Exception]) -> None:
    server.add(path("gemini-2.5-flash"), reply)
    async with gemini(server, "gemini-2.5-flash", retry=NO_RETRY) as m:
        with pytest.raises(ProviderError) as info:
            await m.complete(ask())
    assert type(info.value) is error


async def test_stream_cut_midway(server: ReplayServer, model: GeminiModel) -> None:
    reply = reply_from("google/stream_generate_content_text", mode="cut", cut_after=2)
    server.add(path("gemini-2.5-flash", stream=True), reply)
    seen: list[object] = []
    with pytest.raises(ProviderConnectionError):
        await collect(model.stream(ask()), into=seen)
    assert any(isinstance(e, TextDelta) for e in seen)


async def test_hanging_server_times_out(server: ReplayServer) -> None:
    server.add(path("gemini-2.5-flash"), reply_from("google/generate_content_text", mode="hang"))
    async with gemini(server, "gemini-2.5-flash", retry=NO_RETRY) as m:
        with pytest.raises(ProviderTimeoutError):
            await m.complete(ask(settings=Settings(timeout=0.2)))


async def test_hanging_stream_times_out(server: ReplayServer) -> None:
    reply = reply_from("google/stream_generate_content_text", mode="hang")
    server.add(path("gemini-2.5-flash", stream=True), reply)
    async with gemini(server, "gemini-2.5-flash", retry=NO_RETRY) as m:
        with pytest.raises(ProviderTimeoutError):
            await collect(m.stream(ask(settings=Settings(timeout=0.2))))


def test_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(AuthenticationError, match="GEMINI_API_KEY"):
        GeminiModel("gemini-2.5-flash")
