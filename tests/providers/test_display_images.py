"""Images a cell displayed, sent after the tool result: the request body each SDK sends."""

from __future__ import annotations

import base64

from sunroom.providers import (
    AnthropicModel,
    AssistantMessage,
    GeminiModel,
    ImagePart,
    OpenAIChatModel,
    OpenAIResponsesModel,
    Request,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

from .conftest import FakeTime
from .replay import ReplayServer, reply_from

PNG = b"\x89PNG\r\n\x1a\nfake"
B64 = base64.b64encode(PNG).decode("ascii")
INTRO = "Images your code displayed, in order:"


def transcript(call_id: str) -> Request:
    return Request(
        [
            UserMessage("draw a square"),
            AssistantMessage([ToolCall(call_id, "execute_code", {"code": "display(img)"})]),
            ToolResultMessage(call_id, "[display: image 1 (image/png, 12 bytes), attached]"),
            UserMessage([INTRO, ImagePart(PNG, media_type="image/png")]),
        ]
    )


async def test_anthropic_image_block_joins_the_tool_result_turn(
    server: ReplayServer, fake_time: FakeTime
) -> None:
    server.add("/v1/messages", reply_from("anthropic/messages_text"))
    m = AnthropicModel(
        "claude-replay-test", api_key="k", base_url=server.url, clock=fake_time.clock
    )
    try:
        await m.complete(transcript("toolu_1"))
    finally:
        await m.aclose()
    sent = server.requests[-1].json()["messages"]
    assert [x["role"] for x in sent] == ["user", "assistant", "user"]
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result", "text", "image"]
    assert sent[2]["content"][2]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": B64,
    }


async def test_openai_chat_sends_an_image_url_data_url(
    server: ReplayServer, fake_time: FakeTime
) -> None:
    server.add("/v1/chat/completions", reply_from("openai/chat_text"))
    m = OpenAIChatModel("gpt-4o-2024-08-06", base_url=server.url + "/v1", clock=fake_time.clock)
    try:
        await m.complete(transcript("call_1"))
    finally:
        await m.aclose()
    sent = server.requests[-1].json()["messages"]
    assert [x["role"] for x in sent] == ["user", "assistant", "tool", "user"]
    assert sent[3]["content"][0] == {"type": "text", "text": INTRO}
    assert sent[3]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{B64}"},
    }


async def test_openai_responses_sends_an_input_image(
    server: ReplayServer, fake_time: FakeTime
) -> None:
    server.add("/v1/responses", reply_from("openai/responses_text"))
    m = OpenAIResponsesModel(
        "gpt-4o", api_key="sk-test", base_url=server.url + "/v1", clock=fake_time.clock
    )
    try:
        await m.complete(transcript("call_1"))
    finally:
        await m.aclose()
    items = server.requests[-1].json()["input"]
    assert items[-2]["type"] == "function_call_output"
    last = items[-1]
    assert last["role"] == "user"
    assert last["content"][1] == {
        "type": "input_image",
        "image_url": f"data:image/png;base64,{B64}",
        "detail": "auto",
    }


async def test_gemini_sends_inline_data(server: ReplayServer, fake_time: FakeTime) -> None:
    server.add(
        "/v1beta/models/gemini-2.5-flash:generateContent",
        reply_from("google/generate_content_text"),
    )
    m = GeminiModel("gemini-2.5-flash", api_key="g-key", base_url=server.url, clock=fake_time.clock)
    try:
        await m.complete(transcript("call_1"))
    finally:
        await m.aclose()
    contents = server.requests[-1].json()["contents"]
    assert "functionResponse" in contents[2]["parts"][0]
    parts = contents[-1]["parts"]
    assert parts[0] == {"text": INTRO}
    # the SDK renames the part's key but sends the blob's fields as given (the API takes both)
    assert parts[1]["inlineData"] == {"mime_type": "image/png", "data": B64}
