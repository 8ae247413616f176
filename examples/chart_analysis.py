"""Data in, a chart out, and a model that reads the chart.

A CSV file on the host is bound read-only into the kernel as a pandas DataFrame
(``File(path, load="csv")``: mounted, not copied); the model's code draws revenue by region with
matplotlib; the figure comes back as a PNG display item and goes to the model as an image in its
next turn. The offline model (``--fake``) reads the picture it was sent (its size, from the PNG
itself) and answers.

SUNROOM_MODEL=anthropic:claude-haiku-4-5 python examples/chart_analysis.py
python examples/chart_analysis.py --fake            # offline: a function model reads the PNG
"""

from __future__ import annotations

import asyncio
import io
import tempfile
from pathlib import Path

from _agent_common import configured_model, example_parser, show
from analysis_csv import make_csv
from PIL import Image

from sunroom import File
from sunroom.agent import AsyncSession, Budget
from sunroom.agent import events as ev
from sunroom.providers import AssistantMessage, FunctionModel, ImagePart, Model, Request, ToolCall

DRAW = """
revenue = (sales.assign(revenue=sales.units * sales.unit_price)
                .groupby('region').revenue.sum().sort_values())
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 3))
revenue.plot.barh(ax=ax, title='revenue by region')
print(revenue.round(2).to_dict())
"""


def _images(request: Request) -> list[ImagePart]:
    last = request.messages[-1]
    content = getattr(last, "content", ())
    return [part for part in content if isinstance(part, ImagePart)]


def fake_model() -> Model:
    """Draws the chart, then looks at the image it was sent and answers."""

    def reply(request: Request) -> AssistantMessage | str:
        images = _images(request)
        if not images:
            return AssistantMessage([ToolCall("draw", "execute_code", {"code": DRAW})])
        assert images[0].data is not None
        width, height = Image.open(io.BytesIO(images[0].data)).size
        return (
            f"I was shown a {width}x{height} bar chart of revenue by region; the longest bar, "
            "at the top, is the region with the most revenue (see the printed totals)."
        )

    return FunctionModel(reply)


def write_csv() -> Path:
    """A CSV of sales in a new temporary folder that the kernel's user can read."""
    folder = Path(tempfile.mkdtemp(prefix="sunroom-chart-"))
    folder.chmod(0o755)  # as root, kernels run as other users: they must be able to read it
    path = folder / "sales.csv"
    path.write_text(make_csv())
    path.chmod(0o644)
    return path


async def main() -> None:
    parser = example_parser(__doc__)
    args = parser.parse_args()
    llm = fake_model() if args.fake else configured_model()
    csv_path = write_csv()
    async with (
        llm,
        AsyncSession(
            model=llm,
            backend=args.backend,
            code_tool=args.code_mode == "tool",
            inputs={"sales": File(csv_path, load="csv")},
            budget=Budget(max_model_calls=10, max_wall_s=300),
        ) as session,
    ):
        events = session.events()
        run = asyncio.create_task(
            session.run(
                "`sales` is a pandas DataFrame (date, region, product, units, unit_price). Draw "
                "revenue (units * unit_price) by region as a bar chart with matplotlib, leave "
                "the figure open so that you see it, then tell me which region leads."
            )
        )
        async for event in events:
            show(event)
            if isinstance(event, ev.SessionEnded):
                break
        result = await run
    print(f"\nstatus={result.status} turns={result.turns}")
    print(result.output if result.ok else result.error)


if __name__ == "__main__":
    asyncio.run(main())
