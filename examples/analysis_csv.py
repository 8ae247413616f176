"""Data analysis over a bound CSV: the table is a variable in the kernel, never in the prompt.

SUNROOM_MODEL=anthropic:claude-haiku-4-5 python examples/analysis_csv.py
python examples/analysis_csv.py --fake            # offline, scripted model
"""

from __future__ import annotations

import asyncio
import random

import pydantic
from _agent_common import configured_model, example_parser, show

from sunroom.agent import AsyncSession, Budget
from sunroom.agent import events as ev
from sunroom.providers import AssistantMessage, Model, ScriptedModel, ToolCall


class Summary(pydantic.BaseModel):
    """Sales by region."""

    top_region: str
    top_region_revenue: float
    total_revenue: float
    rows: int


def make_csv(rows: int = 2000) -> str:
    rng = random.Random(1)
    lines = ["date,region,product,units,unit_price"]
    for i in range(rows):
        region = rng.choice(["north", "south", "east", "west"])
        lines.append(
            f"2025-{1 + i % 12:02d}-{1 + i % 28:02d},{region},p{rng.randint(1, 9)},"
            f"{rng.randint(1, 20)},{rng.choice([2.5, 4.0, 9.99])}"
        )
    return "\n".join(lines)


FAKE_CODE = """
import csv, io, collections
rows = list(csv.DictReader(io.StringIO(sales_csv)))
revenue = collections.Counter()
for r in rows:
    revenue[r['region']] += int(r['units']) * float(r['unit_price'])
top, top_rev = revenue.most_common(1)[0]
print(len(rows), dict(revenue))
submit(Summary(top_region=top, top_region_revenue=round(top_rev, 2),
               total_revenue=round(sum(revenue.values()), 2), rows=len(rows)))
"""


def fake_model() -> Model:
    return ScriptedModel(
        [
            AssistantMessage([ToolCall("c1", "execute_code", {"code": "print(sales_csv[:200])"})]),
            AssistantMessage([ToolCall("c2", "execute_code", {"code": FAKE_CODE})]),
        ]
    )


async def main() -> None:
    parser = example_parser(__doc__)
    args = parser.parse_args()
    llm = fake_model() if args.fake else configured_model()
    async with (
        llm,
        AsyncSession(
            model=llm,
            preset="rlm",
            backend=args.backend,
            code_tool=args.code_mode == "tool",
            inputs={"sales_csv": make_csv()},
            output=Summary,
            budget=Budget(max_model_calls=20, max_wall_s=300),
        ) as session,
    ):
        events = session.events()
        run = asyncio.create_task(
            session.run(
                "sales_csv holds a CSV of sales (date, region, product, units, unit_price). "
                "Which region has the most revenue (units * unit_price)? Submit a Summary."
            )
        )
        async for event in events:
            show(event)
            if isinstance(event, ev.SessionEnded):
                break
        result = await run
    print(
        f"\nstatus={result.status} turns={result.turns} tokens={result.usage.total_tokens} "
        f"cost_micro_usd={result.cost_micro_usd}"
    )
    print(result.output if result.ok else result.error)


if __name__ == "__main__":
    asyncio.run(main())
