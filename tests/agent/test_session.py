"""Sessions end to end: ScriptedModel/FunctionModel against real kernels."""

from __future__ import annotations

import asyncio

import pytest

from sunroom.agent import AsyncSession, Budget, Hooks, Session, Veto
from sunroom.agent import events as ev
from sunroom.errors import RateLimitedError, UsageError
from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Message,
    Price,
    Request,
    Response,
    ScriptedModel,
    SystemMessage,
    TextPart,
    ToolResultMessage,
    Usage,
)
from sunroom.providers.fakes import Reply
from tests.agent.conftest import code, collect, last_output

FAST = "subprocess"


async def test_codeact_reads_its_traceback_and_fixes_itself() -> None:
    def agent(request: Request) -> Reply:
        seen = last_output(request) if len(request.messages) > 2 else ""
        if len(request.messages) == 2:
            return code("data = [3, 1, 2]\nprint(sorted(data)[3])")
        if "IndexError" in seen and "sorted(data)[3]" in seen:
            return code("print(sorted(data)[-1])")
        assert seen.strip() == "3", seen
        return "The largest value is 3."

    model = FunctionModel(agent)
    async with AsyncSession(model=model, backend=FAST) as s:
        result = await s.run("What is the largest value?")
    assert result.status == "success"
    assert result.output == "The largest value is 3."
    assert result.turns == 3 and result.model_calls == 3 and result.sub_calls == 0
    assert result.usage.input_tokens > 0
    errors = [m for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert errors[0].is_error and "IndexError: list index out of range" in errors[0].content
    assert [t.name for t in model.requests[0].tools] == ["execute_code"]


async def test_fenced_code_runs_for_models_without_tools() -> None:
    model = ScriptedModel(["Let me look.\n```python\nx = 6 * 7\nprint(x)\n```", "It is 42."])
    async with AsyncSession(model=model, backend=FAST, code_tool=False) as s:
        result = await s.run("6*7?")
    assert result.status == "success" and result.output == "It is 42."
    assert model.requests[0].tools == ()
    assert "42" in last_output(model.requests[1])
    system = model.requests[0].messages[0]
    assert isinstance(system, SystemMessage) and "```python" in system.text


async def test_fenced_code_runs_even_when_tools_are_offered() -> None:
    model = ScriptedModel(["```python\nprint('ran')\n```", "done"])
    async with AsyncSession(model=model, backend=FAST) as s:
        result = await s.run("go")
    assert result.ok and "ran" in last_output(model.requests[1])


async def test_output_is_truncated_for_the_model_but_kept_in_the_kernel() -> None:
    model = ScriptedModel(
        [code("big = 'a' * 3000 + 'MIDDLE' + 'z' * 3000\nprint(big)"), code("len(big)"), "ok"]
    )
    async with AsyncSession(model=model, backend=FAST, max_output_chars=1000) as s:
        sub = s.events()
        result = await s.run("go")
        events = await collect(sub)
    shown = last_output(model.requests[1])
    assert len(shown) < 1200 and "MIDDLE" not in shown
    assert shown.startswith("aaa") and shown.rstrip().endswith("zzz")
    assert "characters cut" in shown
    assert "6006" in last_output(model.requests[2])
    finished = [e for e in events if isinstance(e, ev.ExecutionFinished)]
    assert finished[0].truncated_chars > 5000 and result.ok


async def test_length_ends_the_run_and_is_not_retried() -> None:
    cut = Response(
        message=AssistantMessage([TextPart("```python\nprint('half")]),
        finish_reason="length",
        usage=Usage(input_tokens=10, output_tokens=5),
    )
    model = ScriptedModel([cut, "never used"])
    async with AsyncSession(model=model, backend=FAST) as s:
        result = await s.run("go")
    assert result.status == "length" and result.turns == 1
    assert model.remaining == 1


async def test_max_turns() -> None:
    model = FunctionModel(lambda request: code("print('again')"))
    async with AsyncSession(model=model, backend=FAST, max_turns=3) as s:
        result = await s.run("loop")
    assert result.status == "max_turns" and result.turns == 3


async def test_model_error_is_terminal() -> None:
    model = ScriptedModel([RateLimitedError("slow down", provider="fake")])
    async with AsyncSession(model=model, backend=FAST) as s:
        sub = s.events()
        result = await s.run("go")
        events = await collect(sub)
    assert result.status == "model_error" and "slow down" in (result.error or "")
    assert any(isinstance(e, ev.SessionError) for e in events)


async def test_budget_on_model_calls() -> None:
    model = FunctionModel(lambda request: code("print(1)"))
    async with AsyncSession(
        model=model, backend=FAST, budget=Budget(max_model_calls=2), max_turns=10
    ) as s:
        sub = s.events()
        result = await s.run("go")
        events = await collect(sub)
    assert result.status == "budget_exceeded" and result.model_calls == 2
    assert "2 model calls" in (result.error or "")
    assert [e.limit for e in events if isinstance(e, ev.BudgetWarning)] == ["model_calls"]


async def test_budget_on_tokens_and_cost_counts_sub_calls() -> None:
    price = Price(input=1, output=1)
    sub = FunctionModel(lambda request: "x" * 400, price=price)
    model = FunctionModel(
        lambda request: code("for i in range(100):\n    predict('echo', str(i))"), price=price
    )
    async with AsyncSession(
        model=model, sub_model=sub, backend=FAST, budget=Budget(max_cost_micro_usd=2000)
    ) as s:
        result = await s.run("go")
    assert result.status == "budget_exceeded"
    assert result.cost_micro_usd is not None and result.cost_micro_usd >= 2000
    assert 0 < result.sub_calls < 100
    assert "BudgetExceededError" in last_output(model.requests[-1]) or result.turns == 1


async def test_wall_time_budget_ends_with_timeout() -> None:
    model = FunctionModel(lambda request: code("import time\ntime.sleep(30)"))
    async with AsyncSession(model=model, backend=FAST, budget=Budget(max_wall_s=1.5)) as s:
        result = await s.run("sleep")
    assert result.status == "timeout"


async def test_interrupt_mid_run_reaches_the_next_model_call() -> None:
    gate = asyncio.Event()

    async def wait_for_user() -> str:
        """Block until the user acts."""
        await gate.wait()
        return "resumed"

    model = ScriptedModel([code("print(wait_for_user())"), "Stopping as asked."])
    async with AsyncSession(model=model, backend=FAST, functions=[wait_for_user]) as s:
        sub = s.events()
        await s.send("do a long thing")
        async for event in sub:
            if isinstance(event, ev.HostCallStarted) and event.name == "wait_for_user":
                break
        s.interrupt("stop and summarise now")
        gate.set()
        result = await s.result()
    assert result.ok and result.output == "Stopping as asked."
    second = model.requests[1].messages
    assert isinstance(second[-2], ToolResultMessage) and "resumed" in second[-2].content
    assert second[-1].text == "[Interrupt from the user] stop and summarise now"  # type: ignore[union-attr]


async def test_closing_mid_run_cancels_it() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()

    model = ScriptedModel([code("forever()")])
    s = AsyncSession(model=model, backend=FAST, functions=[forever])
    await s.start()
    running = asyncio.create_task(s.run("go"))
    await started.wait()
    await s.aclose()
    result = await running
    assert result.status == "cancelled"


async def test_send_continues_the_transcript_and_result_needs_a_run() -> None:
    model = ScriptedModel([code("n = 5"), "set", code("n * 2"), "ten"])
    async with AsyncSession(model=model, backend=FAST) as s:
        with pytest.raises(UsageError):
            await s.result()
        first = await s.run("set n")
        await s.send("double it")
        second = await s.result()
    assert (first.output, second.output) == ("set", "ten")
    assert "10" in last_output(model.requests[3])
    assert first.session_id == second.session_id and second.turns == 2


async def test_hooks_veto_cells_and_host_calls() -> None:
    def secret_op() -> str:
        """Does something risky."""
        return "done"

    async def before_execute(src: str) -> Veto | None:
        return Veto("no deleting") if "rm -rf" in src else None

    async def before_host_call(name: str, args: object) -> Veto | None:
        return Veto("not allowed") if name == "secret_op" else None

    model = ScriptedModel([code("# rm -rf /"), code("secret_op()"), "gave up"])
    hooks = Hooks(before_execute=before_execute, before_host_call=before_host_call)
    async with AsyncSession(model=model, backend=FAST, functions=[secret_op], hooks=hooks) as s:
        sub = s.events()
        result = await s.run("go")
        events = await collect(sub)
    assert result.ok
    assert last_output(model.requests[1]) == "vetoed: no deleting"
    assert "PermissionError: secret_op() was vetoed: not allowed" in last_output(model.requests[2])
    assert [(e.what, e.reason) for e in events if isinstance(e, ev.Vetoed)] == [
        ("execute", "no deleting"),
        ("secret_op", "not allowed"),
    ]


async def test_cost_is_none_when_a_price_is_unknown() -> None:
    priced = ScriptedModel([code("predict('hi', 'x')"), "done"], price=Price(input=1, output=1))
    async with AsyncSession(model=priced, sub_model=ScriptedModel(["sub"]), backend=FAST) as s:
        result = await s.run("go")
    assert result.ok and result.cost_micro_usd is None and result.sub_calls == 1


async def test_priced_run_reports_integer_cost() -> None:
    model = ScriptedModel(["done"], price=Price(input=2, output=4))
    async with AsyncSession(model=model, backend=FAST) as s:
        result = await s.run("go")
    u = result.usage
    assert result.cost_micro_usd == u.input_tokens * 2 + u.output_tokens * 4


def test_invalid_options_fail_before_any_kernel() -> None:
    with pytest.raises(UsageError):  # an unknown preset, deliberately ill-typed
        AsyncSession(model=ScriptedModel([]), preset="nope")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        AsyncSession(model=ScriptedModel([]), max_turns=0)
    with pytest.raises(UsageError):
        Budget(max_tokens=0)


def test_sync_session_runs() -> None:
    model = ScriptedModel([code("print(sum(values))"), "The sum is 6."])
    with Session(model=model, backend=FAST, inputs={"values": [1, 2, 3]}) as s:
        result = s.run("sum")
    assert result.ok and result.output == "The sum is 6."
    assert "6" in last_output(model.requests[1])


async def test_full_run_on_the_default_bwrap_backend(bwrap: str) -> None:
    backend = bwrap

    def agent(request: Request) -> Reply:
        if len(request.messages) == 2:
            return code("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
        if len(request.messages) == 4:
            assert "Error" in last_output(request)
            return code("print(sum(x * x for x in values))")
        return f"Sum of squares: {last_output(request).strip()}"

    async with AsyncSession(
        model=FunctionModel(agent), backend=backend, inputs={"values": [1, 2, 3]}
    ) as s:
        result = await s.run("sum of squares, and try the network")
    assert result.ok and result.output == "Sum of squares: 14"


async def test_context_policy_warns_then_compacts_counting_the_summary_call() -> None:
    from sunroom.agent.context import SUMMARY_HEADER, ContextPolicy

    turns = []

    def agent(request: Request) -> Reply:
        if not request.tools:
            return "summary: printed blocks of x"
        turns.append(1)
        return code("print('x' * 1500)") if len(turns) < 7 else "finished"

    model = FunctionModel(agent)
    policy = ContextPolicy(
        context_window=2400, warn_at=0.5, compact_at=0.8, keep_head_messages=2, keep_tail_messages=2
    )
    async with AsyncSession(model=model, backend=FAST, context=policy) as s:
        sub = s.events()
        result = await s.run("print things")
        events = await collect(sub)
    assert result.ok
    kinds = [type(e) for e in events]
    assert ev.ContextWarning in kinds and ev.ContextCompacted in kinds
    assert kinds.index(ev.ContextWarning) < kinds.index(ev.ContextCompacted)
    assert any(SUMMARY_HEADER in repr(m) for m in s.messages)
    summaries = [r for r in model.requests if not r.tools]
    assert summaries and result.model_calls == result.turns + len(summaries)


async def test_a_session_continues_a_recorded_transcript() -> None:
    from sunroom.providers import AssistantMessage, UserMessage

    recorded: list[Message] = [UserMessage("remember the number 41"), AssistantMessage("noted: 41")]
    model = ScriptedModel(["the number was 41"])
    async with AsyncSession(
        model=model, backend=FAST, session_id="resumed-1", transcript=recorded
    ) as s:
        assert s.session_id == "resumed-1"
        result = await s.run("what was the number?")
    assert result.ok and result.session_id == "resumed-1"
    texts = [getattr(m, "text", "") for m in model.requests[0].messages]
    assert any("remember the number 41" in t for t in texts)


async def test_spend_before_a_resume_counts_against_the_budget() -> None:
    from sunroom.agent import Budget
    from sunroom.agent.budget import Spend

    model = ScriptedModel(["never asked"])
    async with AsyncSession(
        model=model,
        backend=FAST,
        budget=Budget(max_model_calls=3),
        spent=Spend(model_calls=3),
    ) as s:
        result = await s.run("go on")
    assert result.status == "budget_exceeded"
    assert model.requests == []
