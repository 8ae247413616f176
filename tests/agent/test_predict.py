"""predict / predict_many from kernel code: typed results, fan-out, failures, budgets, recursion."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Mapping
from typing import Any

import pydantic

from sunroom.agent import AsyncSession, Budget
from sunroom.agent import events as ev
from sunroom.providers import FunctionModel, Request, ScriptedModel
from tests.agent.conftest import code, collect, last_output

FAST = "subprocess"


class Tally(pydantic.BaseModel):
    """The answer of the RLM test."""

    needles: int
    chunks: int
    first_chunk_with_needle: int


def _document(size: int, needles: list[int]) -> str:
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "lorem", "ipsum"]
    text = []
    length = 0
    while length < size:
        w = rng.choice(words)
        text.append(w)
        length += len(w) + 1
    body = " ".join(text)
    chunk = len(body) // 50
    for i in needles:
        at = i * chunk + chunk // 2
        body = body[:at] + " NEEDLE " + body[at:]
    return body


async def test_rlm_over_a_2mb_document_with_predict_many_over_50_chunks() -> None:
    doc = _document(2_000_000, needles=[3, 17, 17, 41])
    assert len(doc) >= 2_000_000

    def sub(request: Request) -> str:
        assert request.output_schema is not None
        text = request.messages[-1].text  # type: ignore[union-attr]
        return json.dumps({"count": text.count("NEEDLE"), "words": len(text.split())})

    cell = """
from dataclasses import dataclass

@dataclass
class ChunkInfo:
    count: int
    words: int

size = len(doc) // 50 + 1
chunks = [doc[i:i + size] for i in range(0, len(doc), size)]
infos = predict_many("Count the word NEEDLE and all words.", chunks, output=ChunkInfo)
assert all(isinstance(i, ChunkInfo) for i in infos), infos[:3]
first = next(n for n, i in enumerate(infos) if i.count)
submit(Tally(needles=sum(i.count for i in infos), chunks=len(chunks), first_chunk_with_needle=first))
"""
    root = ScriptedModel([code("print(len(doc), type(doc).__name__)"), code(cell)])
    sub_model = FunctionModel(sub)
    async with AsyncSession(
        model=root,
        sub_model=sub_model,
        preset="rlm",
        backend=FAST,
        inputs={"doc": doc},
        output=Tally,
        predict_concurrency=8,
    ) as s:
        events = s.events()
        result = await s.run("How many needles are in the document?")
        seen = await collect(events)
    assert result.status == "success", result.error
    assert result.output == Tally(needles=4, chunks=50, first_chunk_with_needle=3)
    assert result.sub_calls == 50 and result.model_calls == 52 and result.turns == 2
    # the document is never in any root prompt
    system = root.requests[0].messages[0].text  # type: ignore[union-attr]
    assert "doc: str, 2,0" in system and "NEEDLE" not in system
    assert all(len(repr(r)) < 50_000 for r in root.requests)
    assert str(len(doc)) in last_output(root.requests[1])
    progress = [e for e in seen if isinstance(e, ev.PredictProgress)]
    assert len(progress) == 50 and progress[-1].done == progress[-1].total == 50


async def test_typed_outputs_and_failed_items() -> None:
    def sub(request: Request) -> str:
        text = request.messages[-1].text  # type: ignore[union-attr]
        if text == "boom":
            raise RuntimeError("the sub-model broke")
        if text == "bad":
            return "not json"
        if request.output_schema is None:
            return text.upper()
        props = request.output_schema.schema.get("properties", {})
        if "value" in props and props["value"].get("type") == "integer":
            return '{"value": ' + str(len(text)) + "}"
        if "value" in props:
            return json.dumps({"value": ["a", "b"]})
        return json.dumps({"label": "spam", "score": 0.5, "tags": ["x"]})

    cell = """
import enum
from dataclasses import dataclass, field
from typing import Literal

class Label(enum.Enum):
    SPAM = "spam"
    HAM = "ham"

@dataclass
class Verdict:
    label: Label
    score: float
    tags: list[str] = field(default_factory=list)

print(predict("shout", "hi"))
print(predict("len", "four", output=int))
print(predict("list", "x", output=list[str]))
v = predict("classify", "buy now", output=Verdict)
print(type(v).__name__, v.label, v.score, v.tags)
rows = predict_many("len", ["a", "boom", "ccc", "bad"], output=int)
print([r if not isinstance(r, PredictError) else (r.type, r.message[:30]) for r in rows])
"""
    root = ScriptedModel([code(cell), "done"])
    async with AsyncSession(model=root, sub_model=FunctionModel(sub), backend=FAST) as s:
        result = await s.run("go")
    out = last_output(root.requests[1])
    assert result.ok, out
    lines = out.splitlines()
    assert lines[0] == "HI"
    assert lines[1] == "4"
    assert lines[2] == "['a', 'b']"
    assert lines[3] == "Verdict Label.SPAM 0.5 ['x']"
    assert lines[4].startswith("[1, ('RuntimeError', 'the sub-model broke'), 3, ('ValueError'")


async def test_invalid_structured_reply_raises_in_the_kernel() -> None:
    root = ScriptedModel([code("predict('n', 'x', output=int)"), "done"])
    sub = ScriptedModel(['{"value": "many"}'])
    async with AsyncSession(model=root, sub_model=sub, backend=FAST) as s:
        await s.run("go")
    out = last_output(root.requests[1])
    assert "ValueError: the sub-model's reply does not match the output schema: " in out
    assert "reply: 'many' is not of type 'integer'" in out


async def test_predict_many_respects_its_concurrency_bound() -> None:
    state = {"now": 0, "peak": 0}

    async def sub(request: Request) -> str:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return "ok"

    root = ScriptedModel([code("r = predict_many('x', list(range(30)))\nprint(len(r))"), "done"])
    async with AsyncSession(
        model=root, sub_model=FunctionModel(sub), backend=FAST, predict_concurrency=4
    ) as s:
        result = await s.run("go")
    assert result.ok and result.sub_calls == 30
    assert 1 < state["peak"] <= 4


async def test_spent_budget_raises_inside_the_kernel_and_ends_the_run() -> None:
    cell = """
try:
    predict_many('x', list(range(20)))
except BudgetExceededError as exc:
    print('caught:', exc)
"""
    root = ScriptedModel([code(cell), "never"])
    async with AsyncSession(
        model=root,
        sub_model=FunctionModel(lambda r: "ok"),
        backend=FAST,
        budget=Budget(max_model_calls=6),
    ) as s:
        events = s.events()
        result = await s.run("go")
        seen = await collect(events)
    assert result.status == "budget_exceeded" and result.model_calls == 6
    assert result.sub_calls == 5
    warnings = [e for e in seen if isinstance(e, ev.BudgetWarning)]
    assert warnings and warnings[0].limit == "model_calls"
    finished = [e for e in seen if isinstance(e, ev.ExecutionFinished)]
    assert re.search(r"caught: .*6 model calls", finished[0].output)


async def test_recursive_predict_runs_a_nested_session_within_the_depth_limit() -> None:
    nested_root = ScriptedModel([code("submit(len(input))")])
    root = ScriptedModel(
        [code("print(predict('count the characters', 'abcdef', output=int, recursive=True))"), "ok"]
    )
    async with AsyncSession(model=root, sub_model=nested_root, backend=FAST, max_depth=2) as s:
        result = await s.run("go")
    assert result.ok and last_output(root.requests[1]).strip() == "6"
    assert result.model_calls == 3 and result.sub_calls == 1
    assert "abcdef" not in repr(nested_root.requests[0].messages[0])  # bound, not prompted

    flat = ScriptedModel([code("predict('x', 'y', recursive=True)"), "ok"])
    async with AsyncSession(model=flat, backend=FAST) as s:
        await s.run("go")
    assert "RecursionError" in last_output(flat.requests[1])


async def test_predict_output_json_schema_is_enforced_on_the_host() -> None:
    replies = iter(['{"value": -3}', '{"value": 7}'])
    schemas: list[Mapping[str, Any]] = []

    def sub(request: Request) -> str:
        assert request.output_schema is not None
        schemas.append(request.output_schema.schema)
        return next(replies)

    cell = """
schema = {"type": "integer", "minimum": 0}
try:
    predict("n", "x", output=schema)
except ValueError as exc:
    print("refused:", exc)
print(predict("n", "x", output=schema))
"""
    root = ScriptedModel([code(cell), "done"])
    async with AsyncSession(model=root, sub_model=FunctionModel(sub), backend=FAST) as s:
        result = await s.run("go")
    out = last_output(root.requests[1])
    assert result.ok, out
    assert "refused: the sub-model's reply does not match the output schema: " in out
    assert "reply: -3 is less than the minimum of 0" in out
    assert out.splitlines()[-1] == "7"
    assert schemas[0]["properties"] == {"value": {"type": "integer", "minimum": 0}}


async def test_predict_dataclass_constraints_reach_the_host() -> None:
    schemas: list[Mapping[str, Any]] = []

    def sub(request: Request) -> str:
        assert request.output_schema is not None
        schemas.append(request.output_schema.schema)
        return json.dumps({"score": 11, "label": "spam"})

    cell = """
from dataclasses import dataclass
from typing import Annotated, Literal

@dataclass
class Verdict:
    '''A verdict.'''
    score: Annotated[int, {"minimum": 0, "maximum": 10}]
    label: Literal["spam", "ham"]

try:
    predict("classify", "buy now", output=Verdict)
except ValueError as exc:
    print("refused:", exc)
"""
    root = ScriptedModel([code(cell), "done"])
    async with AsyncSession(model=root, sub_model=FunctionModel(sub), backend=FAST) as s:
        await s.run("go")
    out = last_output(root.requests[1])
    assert "reply.score: 11 is greater than the maximum of 10" in out, out
    sent = schemas[0]
    assert sent["title"] == "Verdict" and sent["description"] == "A verdict."
    assert sent["properties"] == {
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "label": {"enum": ["spam", "ham"]},
    }
    assert sent["required"] == ["score", "label"] and sent["additionalProperties"] is False


class Scored(pydantic.BaseModel):
    """A host output type whose constraint the kernel's mirror carries."""

    score: int = pydantic.Field(ge=0)


async def test_predict_with_a_host_mirror_keeps_the_host_constraints() -> None:
    root = ScriptedModel([code("predict('s', 'x', output=Scored)"), "done"])
    sub = ScriptedModel(['{"score": -1}'])
    async with AsyncSession(model=root, sub_model=sub, backend=FAST, output=Scored) as s:
        await s.run("go")
    out = last_output(root.requests[1])
    assert "reply.score: -1 is less than the minimum of 0" in out, out


async def test_budget_error_is_a_kernel_class_matched_by_type_not_message() -> None:
    class QuotaError(Exception):
        pass

    calls = []

    def sub(request: Request) -> str:
        calls.append(request)
        if len(calls) == 1:  # a failed call is not counted against the budget
            raise QuotaError("the quota raised BudgetExceededError: spoofed by a message")
        return "ok"

    cell = """
from sunroom.prelude.agent import BudgetExceededError as B
from sunroom.prelude.hostcall import HostFunctionError
try:
    predict('x', 'y')
except Exception as exc:
    print('first:', type(exc).__name__, isinstance(exc, B))
print('ok:', predict('x', 'y'))
try:
    predict('x', 'y')
except BudgetExceededError as exc:
    print('second:', type(exc).__module__, B is BudgetExceededError, isinstance(exc, HostFunctionError))
"""
    root = ScriptedModel([code(cell), "never"])
    async with AsyncSession(
        model=root,
        sub_model=FunctionModel(sub),
        backend=FAST,
        budget=Budget(max_model_calls=2),
    ) as s:
        events = s.events()
        result = await s.run("go")
        seen = await collect(events)
    assert result.status == "budget_exceeded"
    finished = next(e for e in seen if isinstance(e, ev.ExecutionFinished))
    lines = finished.output.splitlines()
    assert "first: HostFunctionError False" in lines, finished.output
    assert "second: sunroom.prelude.agent True True" in lines, finished.output


async def test_a_failed_nested_session_is_an_agent_error_in_the_kernel() -> None:
    # the nested session ends without submitting (its only reply is text): an AgentError on the
    # host, which reaches the calling cell by name
    nested_root = ScriptedModel(["I will not submit"] * 3)
    root = ScriptedModel(
        [
            code(
                "try:\n    predict('x', 'y', output=int, recursive=True)\nexcept Exception as e:\n"
                "    print(type(e).__name__, str(e)[:200])"
            ),
            "ok",
        ]  # fmt: skip
    )
    async with AsyncSession(
        model=root, sub_model=nested_root, backend=FAST, max_depth=2, max_turns=3
    ) as s:
        result = await s.run("go")
    assert result.ok, result
    out = last_output(root.requests[1])
    assert "AgentError" in out and "nested session ended with" in out, out
