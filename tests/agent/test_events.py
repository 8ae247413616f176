"""Events: ordering, the bounded fan-out that never stalls the loop, and redaction."""

from __future__ import annotations

import asyncio

from sunroom.agent import AsyncSession
from sunroom.agent import events as ev
from sunroom.agent.bus import EventBus
from sunroom.providers import FunctionModel, Request, ScriptedModel, Usage, UserMessage
from sunroom.providers.fakes import Reply
from tests.agent.conftest import code, collect, last_output, transcript_text

FAST = "subprocess"
SECRET = "sk-live-4f9a8b7c6d5e4f3a2b1c"


def test_a_full_subscriber_drops_routine_events_but_keeps_control_events() -> None:
    async def main() -> None:
        bus = EventBus(maxsize=3)
        slow = bus.subscribe()
        fast = bus.subscribe(maxsize=1000)
        for i in range(10):
            bus.publish(
                ev.UsageUpdated, usage=Usage(), model_calls=i, cost_micro_usd=0, sub_call=False
            )
            bus.publish(ev.TurnEnded, turn=i)
        assert slow.dropped == 8 and fast.dropped == 0  # 2 routine fit before it filled
        got = []
        while (e := slow.get_nowait()) is not None:
            got.append(e)
        assert [e.turn for e in got if isinstance(e, ev.TurnEnded)] == list(range(10))
        assert [e.seq for e in got] == sorted(e.seq for e in got)
        bus.close()
        rest = [e async for e in fast]
        assert len(rest) == 20 and rest[0].seq == 1 and rest[-1].seq == 20
        assert all(e.ts > 0 for e in rest)

    asyncio.run(main())


async def test_a_slow_subscriber_does_not_stall_the_session() -> None:
    model = FunctionModel(
        lambda r: code("r = predict_many('x', list(range(40)))") if len(r.messages) == 2 else "done"
    )
    async with AsyncSession(
        model=model, sub_model=FunctionModel(lambda r: "ok"), backend=FAST, event_buffer=5
    ) as s:
        stalled = s.events()  # never read while the run goes on
        reader = s.events(maxsize=10_000)
        result = await asyncio.wait_for(s.run("go"), timeout=120)
        everything = await collect(reader)
        late = await collect(stalled)
    assert result.ok
    assert stalled.dropped > 0 and reader.dropped == 0
    controls = [e for e in everything if isinstance(e, ev.CONTROL_EVENTS)]
    assert [type(e) for e in late if isinstance(e, ev.CONTROL_EVENTS)] == [
        type(e) for e in controls
    ]
    assert isinstance(late[-1], ev.SessionEnded)
    assert [e.seq for e in everything] == list(range(1, len(everything) + 1))


async def test_subscriptions_end_when_the_session_closes() -> None:
    s = AsyncSession(model=ScriptedModel([]), backend=FAST)
    sub = s.events()
    await s.aclose()
    assert [e async for e in sub] == []


async def test_secrets_in_tool_output_never_reach_a_model_or_an_event() -> None:
    def fetch_config() -> dict[str, str]:
        """Returns the service config (it holds a key)."""
        return {"url": "https://api.example", "key": SECRET}

    def fail_loudly() -> None:
        """Fails with the key in its message."""
        raise ValueError(f"auth failed for key {SECRET}")

    cell = """
import base64
cfg = fetch_config()
print('config:', cfg)
print('b64:', base64.b64encode(cfg['key'].encode()).decode())
print(predict('echo this', cfg['key']))
fail_loudly()
"""

    def echo(request: Request) -> Reply:
        question = request.messages[-1]
        assert isinstance(question, UserMessage)
        return f"echo {question.text}"

    sub_model = FunctionModel(echo)

    def root(request: Request) -> Reply:
        if len(request.messages) == 2:
            return code(cell)
        return "done"

    model = FunctionModel(root)
    async with AsyncSession(
        model=model,
        sub_model=sub_model,
        backend=FAST,
        functions=[fetch_config, fail_loudly],
        secrets={"api_key": SECRET},
    ) as s:
        sub = s.events()
        result = await s.run(f"use the config (the key is {SECRET})")
        events = await collect(sub)
    assert result.ok
    seen = transcript_text(model.requests) + transcript_text(sub_model.requests)
    assert "[REDACTED:api_key]" in seen and "ValueError: auth failed for key" in seen
    assert SECRET not in seen and SECRET[:12] not in seen
    import base64

    assert base64.b64encode(SECRET.encode()).decode()[:16] not in seen
    assert SECRET not in repr(events) and SECRET not in repr(result)


async def test_secrets_never_enter_the_kernel() -> None:
    def fetch_token() -> str:
        """Returns a token (a registered secret)."""
        return f"token={SECRET}"

    probe = (
        "import gc\n"
        "blob = repr(globals()) + repr([o for o in gc.get_objects() if isinstance(o, str)])\n"
        f"print('LEAK' if {SECRET[:20]!r} in blob else 'clean', fetch_token(), doc)"
    )
    model = ScriptedModel([code(probe), "done"])
    async with AsyncSession(
        model=model,
        backend=FAST,
        functions=[fetch_token],
        inputs={"doc": f"the key is {SECRET}"},
        secrets={"api_key": SECRET},
    ) as s:
        result = await s.run("check")
    assert result.ok
    shown = last_output(model.requests[1])
    assert "clean" in shown and "LEAK" not in shown
    assert "token=[REDACTED:api_key]" in shown and "the key is [REDACTED:api_key]" in shown
