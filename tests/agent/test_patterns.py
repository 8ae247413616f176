"""Schemas' regular expressions run in linear time on the host (RE2), whoever wrote them.

A kernel's ``predict(output=...)`` schema is validated on the host: a catastrophic pattern must
not hold the host's event loop, and a pattern RE2 cannot run is refused when the schema is
parsed, with one clear sentence.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sunroom.agent import AsyncSession
from sunroom.agent.patterns import MAX_PATTERN_CHARS
from sunroom.agent.schema import JsonSchema
from sunroom.errors import UsageError
from sunroom.providers import FunctionModel, Request, ScriptedModel
from tests.agent.conftest import code, last_output

FAST = "subprocess"
EVIL = "^(a+)+$"  # backtracks exponentially in Python's re on 'aaaa...b'


def test_a_catastrophic_pattern_runs_in_linear_time() -> None:
    schema = JsonSchema.parse({"type": "string", "pattern": EVIL})
    started = time.perf_counter()
    with pytest.raises(ValueError, match="does not match"):
        schema.validate("a" * 50_000 + "b", root="reply")
    assert time.perf_counter() - started < 1.0  # re: hours; RE2: well under a millisecond
    assert schema.validate("aaaa", root="reply") == "aaaa"


def test_pattern_properties_and_additional_properties_use_the_same_matcher() -> None:
    schema = JsonSchema.parse(
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "patternProperties": {EVIL: {"type": "integer", "minimum": 0}},
            "additionalProperties": False,
        }
    )
    assert schema.validate({"id": 1, "aaa": 2}, root="o") == {"id": 1, "aaa": 2}
    with pytest.raises(ValueError, match=r"o\.aaa: -1 is less than the minimum of 0"):
        schema.validate({"aaa": -1}, root="o")
    started = time.perf_counter()
    with pytest.raises(ValueError, match="Additional properties are not allowed"):
        schema.validate({"a" * 50_000 + "b": 1}, root="o")
    assert time.perf_counter() - started < 1.0
    typed = JsonSchema.parse(
        {
            "type": "object",
            "patternProperties": {"^x": {}},
            "additionalProperties": {"type": "string"},
        }
    )
    with pytest.raises(ValueError, match="is not of type 'string'"):
        typed.validate({"x1": 5, "y": 5}, root="o")


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "pattern": "(?=a)a"}, "cannot run in linear time"),
        ({"type": "string", "pattern": r"(a)\1"}, "cannot run in linear time"),
        ({"type": "object", "patternProperties": {"(?<=x)y": {}}}, "cannot run in linear time"),
        ({"type": "string", "pattern": "a" * (MAX_PATTERN_CHARS + 1)}, "longer than the 1000"),
        (
            {"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False},
            "unevaluatedProperties beside patternProperties",
        ),
    ],
)
def test_patterns_the_host_will_not_run_are_refused_at_parse(
    schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        JsonSchema.parse(schema)
    assert "\n" not in str(caught.value)


def test_a_property_named_pattern_is_not_a_pattern() -> None:
    schema = JsonSchema.parse(
        {"type": "object", "properties": {"pattern": {"type": "string", "minLength": 2}}}
    )
    with pytest.raises(ValueError, match="too short"):
        schema.validate({"pattern": "x"}, root="o")


async def test_a_kernels_catastrophic_predict_schema_does_not_stall_the_host() -> None:
    """The kernel sends ``pattern: ^(a+)+$``; the sub-model answers 'aaa...b' (40k chars)."""

    def sub(request: Request) -> str:
        return '{"value": "' + "a" * 40_000 + 'b"}'

    cell = """
try:
    predict("n", "x", output={"type": "string", "pattern": "^(a+)+$"})
except ValueError as exc:
    print("refused:", str(exc)[:60])
"""
    root = ScriptedModel([code(cell), "done"])
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    beat = asyncio.create_task(heartbeat())
    started = time.perf_counter()
    try:
        async with AsyncSession(model=root, sub_model=FunctionModel(sub), backend=FAST) as s:
            result = await s.run("go")
    finally:
        beat.cancel()
    took = time.perf_counter() - started
    out = last_output(root.requests[1])
    assert result.ok, out
    assert "refused: the sub-model's reply does not match the output schema" in out
    assert took < 30 and ticks > 0
