"""RLM over a long document: the text is bound in the kernel; code splits it and fans out
``predict_many`` to a sub-model, then submits a typed answer.

    SUNROOM_MODEL=openai:gpt-5-mini python examples/rlm_document.py [path/to/long.txt]
    python examples/rlm_document.py --fake            # offline, scripted models
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pydantic
from _agent_common import configured_model, example_parser, show

from sunroom.agent import AsyncSession, Budget
from sunroom.agent import events as ev
from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Model,
    Request,
    ScriptedModel,
    ToolCall,
)


class Incidents(pydantic.BaseModel):
    """Incidents reported in the document."""

    count: int
    systems: list[str]


def make_document(chars: int = 1_000_000) -> str:
    rng = random.Random(3)
    filler = [
        "The quarterly review went as planned.",
        "Nothing to report for this week.",
        "Maintenance windows were respected.",
        "Capacity stayed within budget.",
    ]
    systems = ["billing", "search", "auth", "storage"]
    parts, size = [], 0
    while size < chars:
        line = (
            f"INCIDENT: the {rng.choice(systems)} service was degraded."
            if rng.random() < 0.002
            else rng.choice(filler)
        )
        parts.append(line)
        size += len(line) + 1
    return "\n".join(parts)


FAKE_CELL = """
from dataclasses import dataclass

@dataclass
class ChunkReport:
    incidents: int
    systems: list[str]

size = 40_000
chunks = [document[i:i + size] for i in range(0, len(document), size)]
reports = predict_many("Count INCIDENT lines and name the systems involved.", chunks, output=ChunkReport)
ok = [r for r in reports if not isinstance(r, PredictError)]
print(len(chunks), "chunks,", len(reports) - len(ok), "failed")
submit(Incidents(count=sum(r.incidents for r in ok), systems=sorted({s for r in ok for s in r.systems})))
"""


def fake_models() -> tuple[Model, Model]:
    root = ScriptedModel(
        [
            AssistantMessage(
                [
                    ToolCall(
                        "c1",
                        "execute_code",
                        {"code": "print(len(document)); print(document[:300])"},
                    )
                ]
            ),
            AssistantMessage([ToolCall("c2", "execute_code", {"code": FAKE_CELL})]),
        ]
    )

    def reader(request: Request) -> str:
        text = request.messages[-1].text  # type: ignore[union-attr]
        lines = [ln for ln in text.splitlines() if ln.startswith("INCIDENT:")]
        systems = sorted({ln.split()[2] for ln in lines})
        return json.dumps({"incidents": len(lines), "systems": systems})

    return root, FunctionModel(reader)


async def main() -> None:
    parser = example_parser(__doc__)
    parser.add_argument("path", nargs="?", help="a text file (default: a generated 1 MB log)")
    args = parser.parse_args()
    document = await asyncio.to_thread(Path(args.path).read_text) if args.path else make_document()
    root, sub = fake_models() if args.fake else (configured_model(), None)
    async with (
        root,
        AsyncSession(
            model=root,
            sub_model=sub,
            preset="rlm",
            backend=args.backend,
            code_tool=args.code_mode == "tool",
            inputs={"document": document},
            output=Incidents,
            budget=Budget(max_model_calls=200, max_wall_s=600),
            predict_concurrency=8,
        ) as session,
    ):
        events = session.events()
        run = asyncio.create_task(
            session.run(
                f"`document` is a {len(document):,}-character operations log. How many INCIDENT "
                "lines does it hold, and which systems do they name? Submit Incidents."
            )
        )
        async for event in events:
            if not isinstance(event, ev.PredictProgress):
                show(event)
            if isinstance(event, ev.SessionEnded):
                break
        result = await run
    truth = sum(1 for ln in document.splitlines() if ln.startswith("INCIDENT:"))
    print(
        f"\nstatus={result.status} turns={result.turns} sub_calls={result.sub_calls} "
        f"tokens={result.usage.total_tokens} cost_micro_usd={result.cost_micro_usd}"
    )
    print(result.output if result.ok else result.error, f"(true count: {truth})")


if __name__ == "__main__":
    asyncio.run(main())
