"""Displayed images reach the model as image parts in the next turn, within a budget."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

from sunroom.agent import AsyncSession
from sunroom.agent import events as ev
from sunroom.agent.images import ImageBudget, TurnImages
from sunroom.providers import ImagePart, ScriptedModel, ToolResultMessage, UserMessage
from sunroom.sandbox.result import DisplayItem
from tests.agent.conftest import code

FAST = "subprocess"
PNG = b"\x89PNG\r\n\x1a\n"
PIL_IMAGES = (
    "from PIL import Image\nfor c in ('red', 'blue'):\n    display(Image.new('RGB', (4, 4), c))"
)


def _images(message: object) -> list[ImagePart]:
    assert isinstance(message, UserMessage)
    return [p for p in message.content if isinstance(p, ImagePart)]


async def test_a_tool_cell_image_follows_its_tool_result() -> None:
    model = ScriptedModel([code(PIL_IMAGES + "\nprint('drawn')"), "two squares"])
    async with AsyncSession(model=model, backend=FAST) as s:
        result = await s.run("draw")
    assert result.ok
    messages = model.requests[1].messages
    tool = next(m for m in messages if isinstance(m, ToolResultMessage))
    assert "drawn" in tool.content
    assert "image 1 (image/png" in tool.content and "image 2 (image/png" in tool.content
    images = _images(messages[-1])
    assert len(images) == 2 and all(i.data and i.data.startswith(PNG) for i in images)
    assert images[0].media_type == "image/png"


async def test_the_execution_event_carries_the_display_items() -> None:
    model = ScriptedModel([code(PIL_IMAGES), "two squares"])
    async with AsyncSession(model=model, backend=FAST) as s:
        events = s.events()
        run = asyncio.create_task(s.run("draw"))
        finished = [e async for e in _until_ended(events) if isinstance(e, ev.ExecutionFinished)]
        assert (await run).ok
    (cell,) = finished
    assert [item["output_type"] for item in cell.outputs] == ["display_data", "display_data"]
    data = cell.outputs[0]["data"]
    assert isinstance(data, dict)
    png = base64.b64decode(data["image/png"])
    assert png.startswith(PNG)
    json.dumps(cell.outputs)  # JSON-ready, as the service stores and streams it


async def _until_ended(events: AsyncIterator[ev.Event]) -> AsyncIterator[ev.Event]:
    async for event in events:
        yield event
        if isinstance(event, ev.SessionEnded):
            return


async def test_fenced_cell_images_ride_with_the_output() -> None:
    model = ScriptedModel([f"```python\n{PIL_IMAGES}\n```", "done"])
    async with AsyncSession(model=model, backend=FAST, code_tool=False) as s:
        assert (await s.run("draw")).ok
    last = model.requests[1].messages[-1]
    assert "Output of your code" in last.text  # type: ignore[union-attr]
    assert len(_images(last)) == 2


async def test_a_model_without_images_gets_placeholder_lines() -> None:
    model = ScriptedModel([code(PIL_IMAGES), "ok"])
    model.accepts_images = False
    async with AsyncSession(model=model, backend=FAST) as s:
        assert (await s.run("draw")).ok
    messages = model.requests[1].messages
    tool = next(m for m in messages if isinstance(m, ToolResultMessage))
    assert tool.content.count("this model takes no images") == 2
    assert not any(
        isinstance(p, ImagePart) for m in messages if isinstance(m, UserMessage) for p in m.content
    )


def test_the_turn_budget_counts_images_and_bytes() -> None:
    item = DisplayItem({"image/png": PNG * 10, "text/plain": "<img>"})
    text = DisplayItem({"text/plain": "hello"})
    turn = TurnImages(ImageBudget(count=2, bytes=10_000))
    lines = turn.take((item, text, item), dropped=1)
    lines += turn.take((item,))
    assert len(turn.parts) == 2
    assert lines[1] == "[display] hello"
    assert "dropped" in lines[3] and "budget" in lines[4]
    small = TurnImages(ImageBudget(count=9, bytes=50))
    assert "budget" in small.take((item,))[0] and not small.parts
