"""submit: host-side validation (pydantic types and JSON Schema), first valid value wins, typed preset."""

from __future__ import annotations

import dataclasses

import pydantic

from sunroom.agent import AsyncSession
from sunroom.agent import events as ev
from sunroom.agent.submit import Submission
from sunroom.providers import ScriptedModel
from tests.agent.conftest import code, collect, last_output

FAST = "subprocess"


class Report(pydantic.BaseModel):
    """A small typed answer."""

    title: str
    count: int = pydantic.Field(ge=0)
    tags: list[str]


async def test_invalid_then_valid_submit() -> None:
    model = ScriptedModel(
        [
            code("submit(Report(title='t', count=-1, tags='x'))"),
            code("submit(Report(title='t', count=3, tags=['x']))"),
        ]
    )
    async with AsyncSession(model=model, backend=FAST, output=Report) as s:
        sub = s.events()
        result = await s.run("report")
        events = await collect(sub)
    assert result.status == "success" and result.output == Report(title="t", count=3, tags=["x"])
    diff = last_output(model.requests[1])
    assert (
        "ValueError: submit(): output.count: Input should be greater than or equal to 0 (got -1); "
        "output.tags: Input should be a valid list (got 'x')"
    ) in diff
    kinds = [
        type(e).__name__ for e in events if isinstance(e, ev.SubmitAccepted | ev.SubmitRejected)
    ]
    assert kinds == ["SubmitRejected", "SubmitAccepted"]


async def test_first_valid_submit_wins_whatever_the_cell_does_after() -> None:
    cell = """
submit(Report(title='first', count=1, tags=[]))
try:
    submit(Report(title='second', count=2, tags=[]))
except RuntimeError as exc:
    print('second refused:', exc)
try:
    raise KeyboardInterrupt
except BaseException:
    pass
raise SystemExit(3)
"""
    model = ScriptedModel([code(cell)])
    async with AsyncSession(model=model, backend=FAST, output=Report) as s:
        sub = s.events()
        result = await s.run("report")
        events = await collect(sub)
    assert result.ok and result.output.title == "first"
    assert any(isinstance(e, ev.SubmitRejected) and "already" in e.reason for e in events)
    finished = next(e for e in events if isinstance(e, ev.ExecutionFinished))
    assert "second refused" in finished.output and finished.status == "error"


async def test_text_reply_without_submit_gets_a_reminder() -> None:
    model = ScriptedModel(["I think it is 3.", code("submit(3)")])
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        result = await s.run("count")
    assert result.ok and result.output == 3 and result.turns == 2
    assert "submit" in last_output(model.requests[1])


@dataclasses.dataclass
class Order:
    """An order to check."""

    sku: str
    quantity: int
    notes: list[str]


class Check(pydantic.BaseModel):
    ok: bool
    reason: str


async def test_typed_preset_binds_fields_and_validates_output() -> None:
    model = ScriptedModel(
        [
            code(
                "submit(Check(ok=quantity <= 10 and sku.startswith('A'), reason=f'{sku}x{quantity}'))"
            )
        ]
    )
    order = Order(sku="A-1", quantity=4, notes=["rush"])
    async with AsyncSession(
        model=model, backend=FAST, preset="typed", inputs=order, output=Check
    ) as s:
        result = await s.run("check the order")
    assert result.ok and result.output == Check(ok=True, reason="A-1x4")
    system = model.requests[0].messages[0].text  # type: ignore[union-attr]
    assert "- sku: str" in system and "- quantity: int" in system and "- notes: list[str]" in system
    assert "A-1" not in system and "rush" not in system


async def test_json_schema_minimum_is_enforced_and_the_model_sees_why() -> None:
    model = ScriptedModel([code("submit(-5)"), code("submit(5)")])
    async with AsyncSession(
        model=model, backend=FAST, output={"type": "integer", "minimum": 0}
    ) as s:
        sub = s.events()
        result = await s.run("count")
        events = await collect(sub)
    assert result.status == "success" and result.output == 5
    seen = last_output(model.requests[1])
    assert "ValueError: submit(): output: -5 is less than the minimum of 0" in seen
    rejected = [e for e in events if isinstance(e, ev.SubmitRejected)]
    assert len(rejected) == 1 and "-5 is less than the minimum of 0" in rejected[0].reason


PEOPLE = {
    "type": "object",
    "$defs": {
        "person": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        }
    },
    "properties": {
        "kind": {"const": "census"},
        "region": {"enum": ["north", "south"]},
        "items": {"type": "array", "items": {"$ref": "#/$defs/person"}, "minItems": 1},
        "total": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "boolean"}]},
    },
    "required": ["kind", "region", "items"],
    "additionalProperties": False,
}

GOOD = {
    "kind": "census",
    "region": "north",
    "items": [{"name": "Ann", "age": 3, "code": "ABC"}],
    "total": 1,
    "note": True,
}


def _bad(**change: object) -> dict[str, object]:
    return {**GOOD, **change}


async def test_every_json_schema_constraint_is_enforced_with_its_path() -> None:
    person = {"name": "Ann", "age": 3}
    cases = [
        (
            _bad(items=[person, person, {"name": "B", "age": -5}]),
            "output.items[2].age: -5 is less than the minimum of 0",
        ),
        (
            _bad(items=[{"name": "B", "age": 151}]),
            "output.items[0].age: 151 is greater than the maximum of 150",
        ),
        (
            _bad(items=[{"name": "B", "age": 1, "code": "abc"}]),
            "output.items[0].code: 'abc' does not match '^[A-Z]{3}$'",
        ),
        (_bad(region="east"), "output.region: 'east' is not one of ['north', 'south']"),
        (_bad(kind="poll"), "output.kind: 'census' was expected"),
        (_bad(items=[{"name": "", "age": 1}]), "output.items[0].name: '' should be non-empty"),
        (
            _bad(items=[{"name": "x" * 21, "age": 1}]),
            "output.items[0].name: 'xxxxxxxxxxxxxxxxxxxxx' is too long",
        ),
        (_bad(items=[]), "output.items: [] should be non-empty"),
        (
            {k: v for k, v in GOOD.items() if k != "region"},
            "output: 'region' is a required property",
        ),
        (_bad(extra=1), "output: Additional properties are not allowed ('extra' was unexpected)"),
        (
            _bad(items=[{"name": "B", "age": 1, "x": 2}]),
            "output.items[0]: Additional properties are not allowed ('x' was unexpected)",
        ),
        (_bad(total=-1), "output.total: -1 is less than the minimum of 0"),
        (_bad(note="toolong"), "output.note: 'toolong' is too long"),
    ]
    cells = [code(f"submit({bad!r})") for bad, _ in cases] + [code(f"submit({GOOD!r})")]
    model = ScriptedModel(cells)
    async with AsyncSession(model=model, backend=FAST, output=PEOPLE, max_turns=30) as s:
        result = await s.run("census")
    assert result.status == "success" and result.output == GOOD
    for i, (_, expected) in enumerate(cases):
        seen = last_output(model.requests[i + 1])
        assert expected in seen, (expected, seen)
        assert "Failed validating" not in seen and "On instance" not in seen  # no raw dump


async def test_invalid_output_schema_is_refused_before_any_kernel_starts() -> None:
    import pytest

    from sunroom.errors import UsageError

    with pytest.raises(UsageError, match="frobnicate"):
        AsyncSession(model=ScriptedModel([]), backend=FAST, output={"type": "frobnicate"})
    with pytest.raises(UsageError, match="remote"):
        AsyncSession(
            model=ScriptedModel([]), backend=FAST, output={"$ref": "http://example.com/s.json"}
        )


def _drop(cls: type[ev.Event], /, **fields: object) -> None:
    """A publisher that keeps nothing."""


def test_a_draft_7_schema_whose_defs_is_not_an_object_still_builds_submit() -> None:
    """``$defs`` is no draft-07 keyword: a non-object value is not shown, and no TypeError."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "$defs": [1]}
    submission = Submission(output=schema, publish=_drop, redact=lambda text: text)
    assert submission.function().name == "submit"
