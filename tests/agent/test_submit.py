"""submit: host-side validation with a per-field diff, first valid value wins, typed preset."""

from __future__ import annotations

import dataclasses

import pydantic

from sunroom.agent import AsyncSession
from sunroom.agent import events as ev
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
    assert "ValueError: submit(): the value does not match Report:" in diff
    assert "count: Input should be greater than or equal to 0 (got -1)" in diff
    assert "tags: Input should be a valid list (got 'x')" in diff
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
