"""OpenTelemetry traces of real sessions: the span tree, GenAI attributes, errors, links, no-ops.

The global TracerProvider of the test process records into an in-memory exporter (the
``spans`` fixture); the models are fakes that return fixed token counts, the kernels real.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import sunroom
from sunroom import AsyncKernel, Template, tracing
from sunroom.agent import AsyncSession, Session
from sunroom.errors import RateLimitedError
from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Request,
    Response,
    ScriptedModel,
    Usage,
    UserMessage,
)
from tests.agent.conftest import code
from tests.mcp.test_binding import CANARY, SERVER

FAST = "subprocess"
SECRET = "hunter2-do-not-trace"

CELL = """
found = lookup("bananas")
labels = predict_many("Label the fruit.", ["apple", "kiwi", "plum"])
submit(len(found) + len(labels))
"""


def lookup(term: str) -> str:
    """Look a term up (a host function)."""
    return term.upper()


def leaky(term: str) -> str:
    """Fail with a secret in the message."""
    raise ValueError(f"{term} failed with password {SECRET}")


def reply(message: AssistantMessage | str, *, tokens: tuple[int, int]) -> Response:
    """A root-model reply with fixed token counts and the vendor's own model name and id."""
    if isinstance(message, str):
        message = AssistantMessage(message)
    return Response(
        message=message,
        finish_reason="tool_use" if message.tool_calls else "stop",
        usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1]),
        model="root-2026-01",
        id=f"resp-{tokens[0]}",
    )


def sub_reply(request: Request) -> Response:
    """The sub-model: a label per fruit, 7 tokens in, 3 out."""
    fruit = request.messages[-1]
    assert isinstance(fruit, UserMessage)
    return Response(
        message=AssistantMessage(f"label of {fruit.text}"),
        finish_reason="stop",
        usage=Usage(input_tokens=7, output_tokens=3),
        model="sub-2026-01",
    )


def named(spans: Iterable[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: Iterable[ReadableSpan], name: str) -> ReadableSpan:
    (found,) = named(spans, name)
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else int(span.parent.span_id)


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def in_order(spans: Iterable[ReadableSpan]) -> list[ReadableSpan]:
    return sorted(spans, key=lambda x: x.start_time or 0)


def linked(span: ReadableSpan) -> list[int]:
    return [link.context.span_id for link in span.links]


def every_value(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute, status description and event attribute of *spans*, as one string."""
    out: list[str] = []
    for s in spans:
        out.append(repr(dict(s.attributes or {})))
        out.append(repr(s.status.description))
        out.extend(repr(e.attributes) for e in s.events)
    return "\n".join(out)


@pytest.mark.kernel
async def test_a_run_is_one_trace_of_agent_model_calls_cells_and_tool_calls(
    spans: InMemorySpanExporter,
) -> None:
    root = ScriptedModel(
        [reply(code(CELL), tokens=(100, 20)), reply("never asked", tokens=(1, 1))],
        name="root",
    )
    sub = FunctionModel(sub_reply, name="sub")
    async with AsyncSession(
        model=root, sub_model=sub, backend=FAST, functions=[lookup], output=int
    ) as s:
        result = await s.run("Count things.")
    assert result.ok and result.output == len("BANANAS") + 3, result
    got = list(spans.get_finished_spans())

    agent = one(got, "invoke_agent codeact")
    assert agent.kind == SpanKind.INTERNAL and agent.parent is None
    assert agent.status.status_code == StatusCode.UNSET
    assert dict(agent.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "codeact",
        "gen_ai.provider.name": "sunroom.custom",
        "gen_ai.conversation.id": s.session_id,
        "gen_ai.usage.input_tokens": 100 + 3 * 7,
        "gen_ai.usage.output_tokens": 20 + 3 * 3,
        "sunroom.run.status": "success",
        "sunroom.run.turns": 1,
    }
    # one trace: the helpers the session installed at its start made no cell span
    assert {x.context.trace_id for x in got if x.context} == {agent.context.trace_id}

    (chat,) = [x for x in named(got, "chat root") if parent_of(x) == span_id(agent)]
    assert chat.kind == SpanKind.CLIENT
    assert dict(chat.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "sunroom.custom",
        "gen_ai.request.model": "root",
        "gen_ai.response.model": "root-2026-01",
        "gen_ai.response.id": "resp-100",
        "gen_ai.response.finish_reasons": ("tool_use",),
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20,
    }

    cell = one(got, "sunroom.cell")
    assert parent_of(cell) == span_id(agent)
    attrs = dict(cell.attributes or {})
    assert attrs["sunroom.cell.code_length"] == len(CELL)
    assert attrs["sunroom.cell.status"] == "ok"
    assert isinstance(attrs["sunroom.cell.index"], int) and attrs["sunroom.cell.index"] >= 1
    assert cell.status.status_code == StatusCode.UNSET

    tools = {x.name: x for x in got if x.name.startswith("execute_tool ")}
    assert set(tools) == {
        "execute_tool lookup",
        "execute_tool predict_many",
        "execute_tool submit",
    }
    for name, tool in tools.items():
        assert parent_of(tool) == span_id(cell), name
        assert tool.kind == SpanKind.INTERNAL
        a = dict(tool.attributes or {})
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"] == name.removeprefix("execute_tool ")
        assert str(a["gen_ai.tool.call.id"]).isdigit()

    predicts = named(got, "chat sub")
    assert len(predicts) == 3
    for p in predicts:  # under the predict_many call that made them, so under the cell
        assert parent_of(p) == span_id(tools["execute_tool predict_many"])
        a = dict(p.attributes or {})
        assert a["gen_ai.usage.input_tokens"] == 7 and a["gen_ai.usage.output_tokens"] == 3
        assert a["gen_ai.request.model"] == "sub" and a["gen_ai.response.model"] == "sub-2026-01"
        assert a["gen_ai.response.finish_reasons"] == ("stop",)

    # privacy: no code, no argument, no prompt, no result in any span
    text = every_value(got)
    for private in ("bananas", "BANANAS", "predict_many(", "apple", "label of", "Count things"):
        assert private not in text, private


@pytest.mark.kernel
async def test_errors_set_error_status_with_the_type_never_the_message(
    spans: InMemorySpanExporter,
) -> None:
    root = ScriptedModel(
        [
            code("leaky('x')"),
            code("1 / 0"),
        ],
        name="root",
    )
    async with AsyncSession(
        model=root, backend=FAST, functions=[leaky], secrets=[SECRET], output=int, max_turns=2
    ) as s:
        result = await s.run("Try.")
    assert result.status == "max_turns"
    got = spans.get_finished_spans()

    tool = one(got, "execute_tool leaky")
    assert tool.status.status_code == StatusCode.ERROR
    assert tool.status.description == "ValueError"
    assert dict(tool.attributes or {})["error.type"] == "ValueError"

    first, second = in_order(named(got, "sunroom.cell"))
    assert parent_of(tool) == span_id(first)
    for cell, error in ((first, "ValueError"), (second, "ZeroDivisionError")):
        assert cell.status.status_code == StatusCode.ERROR
        assert cell.status.description == error
        a = dict(cell.attributes or {})
        assert a["sunroom.cell.error"] == error and a["sunroom.cell.status"] == "error"

    agent = one(got, "invoke_agent codeact")
    assert agent.status.status_code == StatusCode.ERROR
    assert dict(agent.attributes or {})["error.type"] == "max_turns"
    assert SECRET not in every_value(got) and "failed with" not in every_value(got)


@pytest.mark.kernel
async def test_a_failed_model_call_is_an_error_chat_span(spans: InMemorySpanExporter) -> None:
    model = ScriptedModel([RateLimitedError(f"slow down {SECRET}", provider="fake")], name="m")
    async with AsyncSession(model=model, backend=FAST, secrets=[SECRET]) as s:
        result = await s.run("hi")
    assert result.status == "model_error"
    got = spans.get_finished_spans()
    chat = one(got, "chat m")
    assert chat.status.status_code == StatusCode.ERROR
    assert chat.status.description == "RateLimitedError"
    assert "gen_ai.usage.input_tokens" not in dict(chat.attributes or {})
    agent = one(got, "invoke_agent codeact")
    assert parent_of(chat) == span_id(agent)
    assert dict(agent.attributes or {})["error.type"] == "model_error"
    assert SECRET not in every_value(got)


@pytest.mark.kernel
async def test_a_forked_sessions_run_and_cells_link_to_the_fork(
    spans: InMemorySpanExporter,
) -> None:
    model = ScriptedModel(
        [code("rows = [1, 2]"), "set", code("rows.append(3)"), "appended"], name="root"
    )
    async with AsyncSession(model=model, backend=FAST) as s:
        assert (await s.run("set rows")).ok
        fork = await s.fork()
        try:
            assert (await fork.run("append")).ok
        finally:
            await fork.aclose()
    got = spans.get_finished_spans()
    point = one(got, "sunroom.fork")
    assert dict(point.attributes or {})["sunroom.fork.copies"] == 1
    runs = named(got, "invoke_agent codeact")
    assert len(runs) == 2
    parent_run, fork_run = in_order(runs)
    assert linked(parent_run) == [] and linked(fork_run) == [span_id(point)]
    first, then = in_order(named(got, "sunroom.cell"))
    assert parent_of(first) == span_id(parent_run) and linked(first) == []
    assert parent_of(then) == span_id(fork_run) and linked(then) == [span_id(point)]


@pytest.mark.kernel
async def test_branches_are_children_of_the_branched_run_and_link_to_its_fork(
    spans: InMemorySpanExporter,
) -> None:
    model = FunctionModel(lambda request: code("submit(7)"), name="root")
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        result = await s.run("seven", branches=2, choose="vote")
    assert result.ok and result.output == 7
    got = spans.get_finished_spans()
    runs = named(got, "invoke_agent codeact")
    (top,) = [r for r in runs if r.parent is None]
    point = one(got, "sunroom.fork")
    assert parent_of(point) == span_id(top)
    branches = [r for r in runs if r is not top]
    assert len(branches) == 2
    for b in branches:
        assert parent_of(b) == span_id(top)
        assert linked(b) == [span_id(point)]
    assert dict(top.attributes or {})["sunroom.run.status"] == "success"


@pytest.mark.kernel
async def test_kernel_copies_and_template_kernels_link_their_cells(
    spans: InMemorySpanExporter,
) -> None:
    async with AsyncKernel(backend=FAST) as k:
        assert (await k.execute("x = 1")).ok
        copies = await k.fork(2)
        try:
            for c in copies:
                assert (await c.execute("x + 1")).ok
        finally:
            for c in copies:
                await c.aclose()
    async with Template(backend=FAST, setup="y = 2") as t:
        made = await t.kernel()
        try:
            assert (await made.execute("y")).ok
        finally:
            await made.aclose()
    got = spans.get_finished_spans()
    point = one(got, "sunroom.fork")
    made_at = one(got, "sunroom.template")
    assert dict(made_at.attributes or {}) == {
        "sunroom.template.warm": False,
        "sunroom.template.setup_length": len("y = 2"),
    }
    label = {span_id(point): "fork", span_id(made_at): "template"}
    by_links = sorted(tuple(label[i] for i in linked(c)) for c in named(got, "sunroom.cell"))
    # x = 1, the setup (inside the template's span), and the three linked cells
    assert by_links == [(), (), ("fork",), ("fork",), ("template",)]
    setup = [c for c in named(got, "sunroom.cell") if parent_of(c) == span_id(made_at)]
    assert len(setup) == 1


@pytest.mark.kernel
async def test_an_mcp_tool_call_is_an_execute_tool_span_of_its_cell(
    spans: InMemorySpanExporter, no_process_left: None
) -> None:
    server = sunroom.mcp.stdio(
        sys.executable, [SERVER, "stdio"], name="tracker", env={"TOOLSERVER_TOKEN": CANARY}
    )
    model = ScriptedModel([code("print(tracker.add(20, 22))"), "done"])
    async with AsyncSession(model=model, backend=FAST, mcp=[server]) as s:
        assert (await s.run("add")).ok
    got = spans.get_finished_spans()
    tool = one(got, "execute_tool tracker.add")
    cell = one(got, "sunroom.cell")
    assert parent_of(tool) == span_id(cell)
    assert dict(tool.attributes or {})["gen_ai.tool.name"] == "tracker.add"
    assert CANARY not in every_value(got)


@pytest.mark.kernel
async def test_content_is_recorded_only_when_opted_in_and_redacted(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tracing.CAPTURE_CONTENT, "true")
    cell = "print(predict('Name the fruit.', 'a yellow one'))"
    root = ScriptedModel([code(cell), "It is a banana."], name="root")
    sub = FunctionModel(lambda request: "banana", name="sub")
    async with AsyncSession(model=root, sub_model=sub, backend=FAST, secrets=[SECRET]) as s:
        result = await s.run(f"Which fruit? The password is {SECRET}.")
    assert result.ok
    got = spans.get_finished_spans()
    assert SECRET not in every_value(got)
    first, second = in_order(named(got, "chat root"))
    a = dict(first.attributes or {})
    (system,) = json.loads(str(a["gen_ai.system_instructions"]))
    assert system["type"] == "text" and "execute_code" in system["content"]
    (task,) = json.loads(str(a["gen_ai.input.messages"]))
    assert task["role"] == "user" and "Which fruit?" in task["parts"][0]["content"]
    (out,) = json.loads(str(a["gen_ai.output.messages"]))
    assert out["finish_reason"] == "tool_use"
    (call,) = out["parts"]
    assert call["type"] == "tool_call" and call["name"] == "execute_code"
    assert call["arguments"] == {"code": cell}
    then = json.loads(str(dict(second.attributes or {})["gen_ai.input.messages"]))
    assert [m["role"] for m in then] == ["user", "assistant", "tool"]
    assert then[2]["parts"][0]["type"] == "tool_call_response"
    assert "banana" in then[2]["parts"][0]["response"]
    (predicted,) = named(got, "chat sub")
    p = dict(predicted.attributes or {})
    assert json.loads(str(p["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "Name the fruit."}
    ]
    assert json.loads(str(p["gen_ai.input.messages"]))[0]["parts"][0]["content"] == "a yellow one"
    ran = one(got, "sunroom.cell")
    assert dict(ran.attributes or {})["sunroom.cell.code"] == cell

    spans.clear()
    monkeypatch.setenv(tracing.CAPTURE_CONTENT, "false")
    again = ScriptedModel([code("print(1)"), "done"], name="root")
    async with AsyncSession(model=again, backend=FAST) as s:
        assert (await s.run("Again.")).ok
    names = {k for x in spans.get_finished_spans() for k in dict(x.attributes or {})}
    assert not names & {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "sunroom.cell.code",
    }


@pytest.mark.kernel
def test_a_sync_session_run_is_a_child_of_the_callers_span(spans: InMemorySpanExporter) -> None:
    model = ScriptedModel([code("print(1)"), "done"], name="root")
    with (
        trace.get_tracer("an-app").start_as_current_span("handle request") as request,
        Session(model=model, backend=FAST) as s,
    ):
        assert s.run("go").ok
    got = spans.get_finished_spans()
    agent = one(got, "invoke_agent codeact")
    assert parent_of(agent) == request.get_span_context().span_id
    assert {x.context.trace_id for x in got if x.context} == {agent.context.trace_id}


@pytest.mark.kernel
async def test_without_opentelemetry_every_helper_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracing, "_loaded", True)
    monkeypatch.setattr(tracing, "_otel", None)  # as if the API were not installed
    model = ScriptedModel([code("submit(lookup('a'))")])
    null = tracing.chat_span(model)
    assert tracing.agent_span(agent="a", model=model, conversation_id=None) is null
    assert tracing.cell_span(index=1, code_length=1) is null
    assert tracing.tool_span(name="f", call_id=1) is null
    assert tracing.fork_span(copies=2) is null
    assert tracing.template_span(warm=True, setup_length=0) is null
    assert tracing.within(None) is null and tracing.use(None) is null
    assert tracing.quiet() is null
    assert tracing.start_agent_span(agent="a", model=model, conversation_id=None) is None
    assert tracing.current_context() is None and tracing.links_to(None) == ()
    monkeypatch.setenv(tracing.CAPTURE_CONTENT, "true")
    assert not tracing.captures_content()
    with null as span:
        assert span is None
        tracing.record_response(
            span, model="m", response_id=None, finish_reason="stop", input_tokens=1, output_tokens=1
        )
        tracing.record_run(span, status="success", turns=1, input_tokens=1, output_tokens=1)
        tracing.annotate(span, {"a": 1}, error="E")
        tracing.end(span)
    # a whole session runs the same with no tracing at all
    async with AsyncSession(model=model, backend=FAST, functions=[lookup], output=str) as s:
        result = await s.run("go")
    assert result.ok and result.output == "A"
    assert s._kernel.trace_links == ()


def test_provider_names_follow_the_conventions() -> None:
    class Vendor:
        def __init__(self, provider: str, base_url: str | None = None) -> None:
            self.provider = provider
            self.config = type("Config", (), {"base_url": base_url})()

    assert tracing.provider_of(Vendor("anthropic")) == "anthropic"
    assert tracing.provider_of(Vendor("openai")) == "openai"
    assert tracing.provider_of(Vendor("gemini")) == "gcp.gemini"
    assert tracing.provider_of(Vendor("openai-compatible")) == "openai"
    assert tracing.provider_of(Vendor("openai-compatible", "http://127.0.0.1:1/v1")) == (
        "openai-compatible"
    )
    assert tracing.provider_of(Vendor("mistral_ai")) == "mistral_ai"
    assert tracing.provider_of(ScriptedModel([])) == "sunroom.custom"
