from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sunroom.errors import ClosedError, RateLimitedError, UsageError
from sunroom.providers import (
    AssistantMessage,
    Done,
    FunctionModel,
    Message,
    Model,
    Price,
    Request,
    Response,
    ScriptedModel,
    ScriptExhaustedError,
    StreamEvent,
    SystemMessage,
    TextDelta,
    ToolCall,
    ToolCallComplete,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageUpdate,
    UserMessage,
    model,
)

from .conftest import collect


def ask(text: str = "hi") -> Request:
    return Request([UserMessage(text)])


async def test_scripted_text_and_tool_calls() -> None:
    call = ToolCall("call_1", "execute_code", {"code": "print(1)"})
    model = ScriptedModel([AssistantMessage(["running it", call]), "done"])
    assert isinstance(model, Model)
    first = await model.complete(ask("go"))
    assert first.finish_reason == "tool_use"
    assert first.tool_calls == (call,)
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert first.cost_micro_usd is None
    second = await model.complete(ask("next"))
    assert (second.text, second.finish_reason) == ("done", "stop")
    assert [r.messages[-1] for r in model.requests] == [UserMessage("go"), UserMessage("next")]
    assert model.remaining == 0


async def test_scripted_runs_out_clearly() -> None:
    model = ScriptedModel(["only one"])
    await model.complete(ask())
    with pytest.raises(ScriptExhaustedError, match="no reply left for call 2") as info:
        await model.complete(ask())
    assert isinstance(info.value, UsageError)


async def test_scripted_raises_scripted_errors() -> None:
    model = ScriptedModel([RateLimitedError("slow down", retry_after=1), "ok"])
    with pytest.raises(RateLimitedError):
        await model.complete(ask())
    assert (await model.complete(ask())).text == "ok"


async def test_scripted_stream_chunks_text_and_arguments() -> None:
    call = ToolCall("c1", "f", {"city": "Edinburgh"})
    model = ScriptedModel(["hello world", AssistantMessage([call])], chunk_size=4)
    events = await collect(model.stream(ask()))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["hell", "o wo", "rld"]
    assert isinstance(events[-2], UsageUpdate) and isinstance(events[-1], Done)
    events = await collect(model.stream(ask()))
    pieces = [e.arguments_delta for e in events if isinstance(e, ToolCallDelta)]
    assert pieces[0] == "" and all(len(p) <= 4 for p in pieces)
    assert json.loads("".join(pieces)) == {"city": "Edinburgh"}
    (complete,) = [e for e in events if isinstance(e, ToolCallComplete)]
    assert complete.call == call


async def test_scripted_explicit_stream_events() -> None:
    response = Response(AssistantMessage("ab"), "stop", Usage(1, 2))
    script: list[StreamEvent] = [TextDelta("a"), TextDelta("b"), Done(response)]
    model = ScriptedModel([script, script])
    assert await collect(model.stream(ask())) == script
    assert await model.complete(ask()) is response


async def test_scripted_stream_must_end_with_done() -> None:
    model = ScriptedModel([[TextDelta("a")]])
    with pytest.raises(UsageError, match="Done"):
        await model.complete(ask())


async def test_scripted_price_gives_cost() -> None:
    model = ScriptedModel(["x" * 40], price=Price(input=1, output=2))
    response = await model.complete(ask("y" * 40))
    usage = response.usage
    assert response.cost_micro_usd == usage.input_tokens * 1 + usage.output_tokens * 2


async def test_function_model_sync_and_async() -> None:
    upper = FunctionModel(lambda req: req.messages[-1].text.upper())  # type: ignore[union-attr]
    assert (await upper.complete(ask("shout"))).text == "SHOUT"

    async def echo(req: Request) -> str:
        return f"{len(req.messages)} messages"

    model = FunctionModel(echo, name="echo")
    response = await model.complete(ask())
    assert (response.text, response.model) == ("1 messages", "echo")
    events = await collect(model.stream(ask()))
    assert isinstance(events[-1], Done) and events[-1].response.text == "1 messages"
    assert len(model.requests) == 2


async def test_fakes_close() -> None:
    model = ScriptedModel(["a"])
    async with model:
        pass
    with pytest.raises(ClosedError):
        await model.complete(ask())


def write_script(tmp_path: Path, script: object) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(script))
    return str(path)


AGENT = SystemMessage("You are the agent.")


def turn(n: int, *, tools: bool = True) -> Request:
    """The agent's request after *n* replies (with or without the execute_code tool)."""
    messages: list[Message] = [AGENT, UserMessage("task")]
    for i in range(n):
        messages += [AssistantMessage(f"reply {i}"), UserMessage(f"output {i}")]
    return Request(messages, tools=[EXECUTE] if tools else [])


EXECUTE = ToolSpec("execute_code", "Run Python.", {"type": "object"})


async def test_scripted_spec_replays_a_file_by_turn(tmp_path: Path) -> None:
    path = write_script(
        tmp_path,
        {"replies": [{"text": "Looking.", "code": "print(1)"}, "the answer"], "sub_reply": "tiny"},
    )
    async with model(f"scripted:{path}") as llm:
        first = await llm.complete(turn(0))
        assert first.text == "Looking." and first.finish_reason == "tool_use"
        assert first.tool_calls[0].name == "execute_code"
        assert first.tool_calls[0].arguments == {"code": "print(1)"}
        sub = Request([SystemMessage("Summarise."), UserMessage("chunk")])
        assert (await llm.complete(sub)).text == "tiny"  # predict: not the agent's turn
        assert (await llm.complete(turn(1))).text == "the answer"
        assert (await llm.complete(turn(5))).text == "the answer"  # the last reply repeats
        assert (await llm.complete(turn(0))).tool_calls  # a resumed transcript continues


async def test_scripted_spec_writes_fenced_code_when_no_tool_is_offered(tmp_path: Path) -> None:
    path = write_script(tmp_path, [{"code": "x = 6 * 7\nprint(x)", "text": "Computing."}, "42"])
    async with model(f"scripted:{path}") as llm:
        first = await llm.complete(turn(0, tools=False))
        assert not first.tool_calls and first.finish_reason == "stop"
        assert first.text == "Computing.\n\n```python\nx = 6 * 7\nprint(x)\n```"
        assert (await llm.complete(turn(1, tools=False))).text == "42"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, ["cannot read", "replies.json"]),
        ("{not json", ["not JSON", "replies.json"]),
        ("[]", ["non-empty list of replies"]),
        ('[{"python": "1"}]', ["reply 0", "code"]),
        ('{"replies": ["a"], "delay_s": "soon"}', ["delay_s"]),
    ],
)
def test_scripted_spec_file_errors_are_one_line_usage_errors(
    tmp_path: Path, content: str | None, words: list[str]
) -> None:
    path = tmp_path / "replies.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as info:
        model(f"scripted:{path}")
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


async def test_scripted_spec_delay(tmp_path: Path) -> None:
    path = write_script(tmp_path, {"replies": ["slow"], "delay_s": 0.2})
    async with model(f"scripted:{path}") as llm:
        started = time.monotonic()
        assert (await llm.complete(turn(0))).text == "slow"
        assert time.monotonic() - started >= 0.2
