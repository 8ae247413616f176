"""Evaluating an untrusted snippet: the code runs in the isolated kernel (bwrap by default),
a hook shows every cell before it runs and refuses obviously destructive ones, and the key
the host holds is registered as a secret, so it never reaches the model or the events.

    SUNROOM_MODEL=gemini:gemini-2.5-flash python examples/untrusted_snippet.py
    python examples/untrusted_snippet.py --fake       # offline, scripted model
"""

from __future__ import annotations

import asyncio

import pydantic
from _agent_common import configured_model, example_parser, show

from sunroom import Limits
from sunroom.agent import AsyncSession, Budget, Hooks, Veto
from sunroom.agent import events as ev
from sunroom.providers import AssistantMessage, Model, ScriptedModel, ToolCall

SNIPPET = """
import os, socket
print("env keys:", sorted(os.environ)[:5])
try:
    socket.create_connection(("1.1.1.1", 443), timeout=2)
    print("network: reachable")
except OSError as exc:
    print("network: blocked", type(exc).__name__)
print("sum:", sum(range(10)))
"""

HOST_KEY = "sk-demo-0123456789abcdef"


class Verdict(pydantic.BaseModel):
    """What the snippet did."""

    runs: bool
    network_reachable: bool
    output: str


FAKE_CELL = """
import contextlib, io
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        exec(snippet, {})
        runs = True
    except BaseException as exc:
        print('raised', type(exc).__name__, exc)
        runs = False
out = buf.getvalue()
print(out)
submit(Verdict(runs=runs, network_reachable='reachable' in out, output=out[-500:]))
"""


def fake_model() -> Model:
    return ScriptedModel(
        [
            AssistantMessage(
                [ToolCall("c0", "execute_code", {"code": "import shutil; shutil.rmtree('/')"})]
            ),
            AssistantMessage([ToolCall("c1", "execute_code", {"code": FAKE_CELL})]),
        ]
    )


async def review(code: str) -> Veto | None:
    if "rmtree" in code or "rm -rf" in code:
        return Veto("destructive file operations are not allowed")
    return None


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
            limits=Limits(timeout_s=10, memory_mb=512),
            inputs={"snippet": SNIPPET},
            output=Verdict,
            hooks=Hooks(before_execute=review),
            secrets={"host_key": HOST_KEY},
            budget=Budget(max_model_calls=10, max_wall_s=120),
            system_prompt=f"(The operator's key {HOST_KEY} must never be printed.)",
        ) as session,
    ):
        events = session.events()
        run = asyncio.create_task(
            session.run(
                "Run the untrusted Python in `snippet` safely (exec it with its own globals, catch "
                "everything) and submit a Verdict: did it run, could it reach the network, output."
            )
        )
        async for event in events:
            show(event)
            if isinstance(event, ev.SessionEnded):
                break
        result = await run
        assert HOST_KEY not in repr(session.messages)
    print(f"\nstatus={result.status} turns={result.turns}")
    print(result.output if result.ok else result.error)


if __name__ == "__main__":
    asyncio.run(main())
