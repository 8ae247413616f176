"""Forked sessions and branched runs: fork(), run(task, branches=k, choose=...).

Every test ends with no process left behind: losing branches, the session's former kernel and
every fork are closed. The models are fakes: a branch's first model call takes the next script
from a shared queue, and its later calls find their script by the marker in its first cell.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Callable, Sequence

import pytest

from sunroom.agent import AsyncSession, Budget, RunResult, Session, Subscription
from sunroom.agent import events as ev
from sunroom.errors import ClosedError, UsageError
from sunroom.providers import AssistantMessage, FunctionModel, Request, ToolCall, UserMessage
from sunroom.providers.fakes import Reply
from sunroom.sandbox.portal import TwinState
from sunroom.service.codec import event_to_json
from tests.agent.conftest import code

FAST = "subprocess"


pytestmark = pytest.mark.usefixtures("no_process_left")


def branch_model(scripts: Sequence[Sequence[str]], *, then: str = "no answer") -> FunctionModel:
    """A model whose i-th branch (in order of first calls) replies with ``scripts[i]``'s cells.

    Cell j of script i runs ``# branch i`` first, so later calls know their branch. Past its
    script a branch gets the text *then*.
    """
    first = itertools.count()

    def reply(request: Request) -> Reply:
        messages = request.messages
        task = max(
            i
            for i, m in enumerate(messages)
            if isinstance(m, UserMessage) and not m.text.startswith("You have not submitted")
        )
        turns = [m for m in messages[task:] if isinstance(m, AssistantMessage)]
        if not turns:  # a run's first call: the next script
            i = next(first)
            return code(f"# branch {i}\n{scripts[i][0]}") if i < len(scripts) else then
        calls = [p for p in turns[0].content if isinstance(p, ToolCall)]
        match = re.match(r"# branch (\d+)", str(calls[0].arguments["code"])) if calls else None
        if match is None:
            return then
        i, j = int(match.group(1)), len(turns)
        return code(f"# branch {i}\n{scripts[i][j]}") if j < len(scripts[i]) else then

    return FunctionModel(reply, name="branches")


def drain(sub: Subscription) -> list[ev.Event]:
    out = []
    while (e := sub.get_nowait()) is not None:
        out.append(e)
    return out


async def value(s: AsyncSession, expr: str) -> object:
    result = await s._kernel.execute(expr)
    assert result.ok, result
    return result.value


# -- fork ----------------------------------------------------------------------------------


async def test_a_fork_continues_from_a_copy_and_shares_the_budget() -> None:
    model = branch_model([["rows = [1, 2]\nsubmit(len(rows))"]])
    async with AsyncSession(model=model, backend=FAST, budget=Budget(max_model_calls=10)) as s:
        first = await s.run("count")
        assert first.ok and first.output == 2
        fork = await s.fork()
        try:
            assert fork.parent_id == s.session_id and fork.session_id != s.session_id
            assert fork.branch is None and fork.tracker is s.tracker
            assert fork.messages == s.messages
            await fork._kernel.execute("rows.append(3)")
            assert await value(fork, "len(rows)") == "3"
            assert await value(s, "len(rows)") == "2"
            spent = s.tracker.snapshot().model_calls
            again = await fork.run("count again")  # the script is over: a text answer
            assert again.ok and again.output == "no answer"
            assert s.tracker.snapshot().model_calls == spent + 1
            assert len(fork.messages) == len(s.messages) + 2 and len(s.messages) == 4
            await s.aclose()  # closing the parent leaves the fork running
            assert await value(fork, "rows") == "[1, 2, 3]"
        finally:
            await fork.aclose()


async def test_fork_is_refused_while_a_run_is_in_progress_and_after_close() -> None:
    model = branch_model([["import time\ntime.sleep(30)"]])
    s = AsyncSession(model=model, backend=FAST)
    try:
        await s.send("go")
        assert s.running
        with pytest.raises(UsageError, match="cannot fork while a run is in progress"):
            await s.fork()
        with pytest.raises(UsageError, match="a run is already in progress"):
            await s.run("again", branches=2)
    finally:
        await s.aclose()
    with pytest.raises(ClosedError):
        await s.fork()


# -- choose="first" -------------------------------------------------------------------------


async def test_first_valid_submit_wins_and_the_losers_are_closed_at_once() -> None:
    model = branch_model(
        [
            ["import time\ntime.sleep(60)\nx = 'slow'\nsubmit(0)"],
            ["x = 'bad'\nsubmit('not an int')", "x = 'fixed'\nsubmit(1)"],
            ["x = 'quits'"],  # then a text answer: no submit, so it fails
        ]
    )
    async with AsyncSession(model=model, backend=FAST, output=int, max_turns=3) as s:
        sub = s.events()
        started = time.monotonic()
        result = await asyncio.wait_for(s.run("answer", branches=3), timeout=50)
        assert time.monotonic() - started < 30  # the sleeping branch was killed, not awaited
        assert result.ok and result.output == 1 and result.session_id == s.session_id
        assert result.turns == 2  # the winner's
        events = drain(sub)
        (chosen,) = [e for e in events if isinstance(e, ev.BranchChosen)]
        assert chosen.chosen == "1.1" and "first" in chosen.reason
        ended = {e.branch: e.result.status for e in events if isinstance(e, ev.BranchEnded)}
        assert ended["1.1"] == "success" and ended["1.0"] == "cancelled"
        # the session continues from the winner: its kernel and its transcript
        assert await value(s, "x") == "'fixed'"
        assert "submit('not an int')" in repr(s.messages)
        assert "time.sleep(60)" not in repr(s.messages)
        assert result.model_calls == s.tracker.snapshot().model_calls  # every branch's calls


async def test_no_successful_branch_keeps_the_session_as_it_was() -> None:
    model = branch_model([["x = 1"], ["x = 2"]], then="still no answer")
    async with AsyncSession(model=model, backend=FAST, output=int, max_turns=2) as s:
        await s._kernel.execute("x = 'before'")
        before = s.messages
        result = await s.run("answer", branches=2)
        assert result.status == "max_turns" and result.output is None
        assert result.error == "no branch succeeded (2 max_turns)"
        assert s.messages == before
        assert await value(s, "x") == "'before'"


# -- choose="vote" --------------------------------------------------------------------------


async def test_vote_picks_the_largest_group_of_equal_outputs() -> None:
    outputs = ["{'a': 1, 'b': 2}", "{'b': 9}", "{'b': 2, 'a': 1}", "{'b': 9}", "{'a': 1, 'b': 2}"]
    model = branch_model([[f"x = {i}\nsubmit({o})"] for i, o in enumerate(outputs)])
    async with AsyncSession(model=model, backend=FAST, output=dict) as s:
        sub = s.events()
        result = await s.run("answer", branches=5, choose="vote")
        assert result.ok and result.output == {"a": 1, "b": 2}
        events = drain(sub)
        (chosen,) = [e for e in events if isinstance(e, ev.BranchChosen)]
        assert chosen.reason == "3 of 5 branches agreed on the output"
        assert chosen.chosen is not None
        winner = int(chosen.chosen.split(".")[1])
        assert outputs[winner].startswith("{'a'") or outputs[winner].startswith("{'b': 2")
        assert await value(s, "x") == str(winner)
        ended = [e for e in events if isinstance(e, ev.BranchEnded)]
        assert sorted(e.result.status for e in ended) == ["success"] * 5  # all ran to the end
        assert result.model_calls == 5


# -- choose=callable ------------------------------------------------------------------------


async def test_a_callable_verifier_picks_the_branch() -> None:
    seen: list[list[RunResult]] = []

    async def largest(results: list[RunResult]) -> int:
        seen.append(results)
        await asyncio.sleep(0)
        return max(range(len(results)), key=lambda i: results[i].output)

    model = branch_model([[f"x = {n}\nsubmit({n})"] for n in (3, 7, 5)])
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        result = await s.run("answer", branches=3, choose=largest)
        assert result.ok and result.output == 7
        assert await value(s, "x") == "7"
        (results,) = seen
        assert sorted(r.output for r in results) == [3, 5, 7]
        assert [r.session_id for r in results] == [f"{s.session_id}/1.{i}" for i in range(3)]


async def test_a_callable_may_return_a_result_or_turn_every_branch_down() -> None:
    def smallest(results: list[RunResult]) -> RunResult:
        return min(results, key=lambda r: r.output)

    def none(results: list[RunResult]) -> None:
        return None

    model = branch_model([[f"x = {n}\nsubmit({n})"] for n in (4, 2, 9, 1)])
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        assert (await s.run("answer", branches=2, choose=smallest)).output in (2, 4)
        before, x = s.messages, await value(s, "x")
        rejected = await s.run("again", branches=2, choose=none)
        assert rejected.status == "rejected" and rejected.output is None
        assert (
            rejected.error
            == "test_a_callable_may_return_a_result_or_turn_every_branch_down.<locals>.none turned every branch down"
        )
        assert s.messages == before and await value(s, "x") == x


@pytest.mark.parametrize(
    ("choose", "error"),
    [
        (lambda results: 7, "choose failed: UsageError: choose returned 7"),
        (lambda results: 1 / 0, "choose failed: ZeroDivisionError"),
    ],
)
async def test_a_failing_callable_ends_the_run_with_internal_error(
    choose: Callable[[list[RunResult]], int], error: str
) -> None:
    model = branch_model([["submit(1)"], ["submit(2)"]])
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        result = await s.run("answer", branches=2, choose=choose)
        assert result.status == "internal_error" and result.error is not None
        assert result.error.startswith(error)


# -- budget, events, options ----------------------------------------------------------------


async def test_the_budget_covers_every_branch() -> None:
    model = branch_model([["pass"] * 10] * 3)
    budget = Budget(max_model_calls=5)
    async with AsyncSession(model=model, backend=FAST, budget=budget, output=int) as s:
        sub = s.events()
        result = await s.run("answer", branches=3, choose="vote")
        assert result.status == "budget_exceeded"
        assert result.model_calls == 5 == s.tracker.snapshot().model_calls
        events = drain(sub)
        ended = [e.result for e in events if isinstance(e, ev.BranchEnded)]
        assert [r.status for r in ended] == ["budget_exceeded"] * 3
        assert sum(r.model_calls for r in ended) >= 5  # each counts the shared calls it saw
        warned = {e.branch for e in events if isinstance(e, ev.BudgetWarning)}
        assert warned and warned <= {"1.0", "1.1", "1.2"}  # the others stop after their turn


async def test_every_branch_event_carries_its_branch_id() -> None:
    model = branch_model([["submit(1)"], ["submit(2)"], ["submit(1)"], ["x = 1"], ["submit(4)"]])
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        sub = s.events()
        await s.run("answer", branches=3, choose="vote")
        second = await s.run("again", branches=2, choose="first")
        assert second.ok and second.output == 4
        events = drain(sub)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    started = [e.branches for e in events if isinstance(e, ev.BranchesStarted)]
    assert started == [("1.0", "1.1", "1.2"), ("2.0", "2.1")]
    own = (ev.BranchesStarted, ev.BranchChosen, ev.SessionEnded)
    for e in events:
        assert (e.branch is None) == isinstance(e, own), e
    assert [type(e) for e in events if e.branch is None] == [*own, *own]
    first_run = events[: events.index(next(e for e in events if isinstance(e, ev.SessionEnded)))]
    by_branch = {e.branch for e in first_run if e.branch}
    assert by_branch == {"1.0", "1.1", "1.2"}
    assert sum(isinstance(e, ev.BranchEnded) for e in first_run) == 3


async def test_one_branch_is_a_plain_run() -> None:
    model = branch_model([["submit(1)"]])
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        sub = s.events()
        result = await s.run("answer", branches=1, choose="vote")
        assert result.ok and result.output == 1
        events = drain(sub)
    assert all(e.branch is None for e in events)
    assert not any(isinstance(e, ev.BranchesStarted | ev.BranchEnded) for e in events)


@pytest.mark.parametrize("branches", [0, 65, True, 2.0, "2"])
async def test_invalid_branches_are_refused(branches: object) -> None:
    async with AsyncSession(model=branch_model([]), backend=FAST) as s:
        with pytest.raises(UsageError, match="branches must be an int from 1 to 64"):
            await s.run("x", branches=branches)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="choose must be 'first', 'vote' or a callable"):
            await s.run("x", branches=2, choose="best")  # type: ignore[arg-type]


async def test_the_rlm_preset_runs_k_programs_over_the_same_context() -> None:
    context = "alpha beta gamma beta beta"
    programs = [
        "submit(context.split().count('beta'))",
        "submit(sum(w == 'beta' for w in context.split()))",
        "submit(len(context.split('beta')) - 1)",
        "submit(context.count('a'))",  # a wrong program
    ]
    model = branch_model([[p] for p in programs])
    async with AsyncSession(
        model=model, backend=FAST, preset="rlm", inputs={"context": context}, output=int
    ) as s:
        result = await s.run("how many times does 'beta' occur?", branches=4, choose="vote")
    assert result.ok and result.output == 3
    for request in model.requests:
        assert context not in repr(request.messages)  # the context stays in the kernel


def test_the_sync_twin_forks_and_branches() -> None:
    model = branch_model([["y = 5\nsubmit(y)"], ["submit(6)"], ["submit(5)"], ["submit(5)"]])
    with Session(model=model, backend=FAST, output=int, max_turns=2) as s:
        first = s.run("answer")
        assert first.output == 5
        first_messages = s.messages
        fork = s.fork()
        try:
            assert fork.parent_id == s.session_id and fork.tracker is s.tracker
            result = s.run("again", branches=3, choose="vote")
            assert result.ok and result.output == 5
        except BaseException:
            fork.close()
            raise
    try:
        assert fork.messages == first_messages
        assert fork.state is TwinState.OPENED  # closing the parent left the fork usable
        assert fork.run("more").status == "max_turns"  # no submit: the script is over
    finally:
        fork.close()  # the last one stops the shared loop thread


async def test_branches_on_bwrap(bwrap: str) -> None:
    model = branch_model([["import time\ntime.sleep(60)\nsubmit(0)"], ["x = 1\nsubmit(1)"]])
    async with AsyncSession(model=model, backend=bwrap, output=int) as s:
        result = await asyncio.wait_for(s.run("answer", branches=2), timeout=50)
        assert result.ok and result.output == 1
        assert await value(s, "x") == "1"


async def test_send_reaches_every_running_branch() -> None:
    def reply(request: Request) -> Reply:
        if not any(isinstance(m, AssistantMessage) for m in request.messages):
            return code("import time\ntime.sleep(1.5)")
        return code(f"submit({int('the hint' in repr(request.messages))})")

    async with AsyncSession(model=FunctionModel(reply), backend=FAST, output=int) as s:
        sub = s.events()
        run = asyncio.create_task(s.run("go", branches=2, choose="vote"))
        await asyncio.sleep(0.7)
        assert s.running
        await s.send("the hint")
        result = await asyncio.wait_for(run, timeout=30)
        assert result.ok and result.output == 1
        ended = [e.result for e in drain(sub) if isinstance(e, ev.BranchEnded)]
        assert [r.output for r in ended] == [1, 1]


async def test_cancelling_a_branched_run_closes_every_branch() -> None:
    model = branch_model([["import time\ntime.sleep(60)"]] * 3)
    async with AsyncSession(model=model, backend=FAST) as s:
        await s._kernel.execute("x = 'before'")
        before = s.messages
        sub = s.events()
        run = asyncio.create_task(s.run("go", branches=3))
        await asyncio.sleep(0.5)
        s.cancel()
        result = await asyncio.wait_for(run, timeout=20)
        assert result.status == "cancelled" and result.error == "the run was cancelled"
        assert s.messages == before and await value(s, "x") == "'before'"
        events = drain(sub)
        assert [e.result.status for e in events if isinstance(e, ev.BranchEnded)] == [
            "cancelled"
        ] * 3
        assert isinstance(events[-1], ev.SessionEnded)


def test_the_service_codec_writes_branch_only_when_set() -> None:
    own = ev.TurnEnded(seq=1, ts=1.0, turn=1)
    theirs = ev.TurnEnded(seq=2, ts=2.0, turn=1, branch="1.0")
    assert event_to_json(own, session_id="s") == ("TurnEnded", {"turn": 1})
    assert event_to_json(theirs, session_id="s") == ("TurnEnded", {"turn": 1, "branch": "1.0"})


async def test_branches_stream_their_output_and_the_winners_kernel_streams_to_the_session() -> None:
    model = branch_model(
        [["print('out', 0)\nsubmit(1)"], ["print('out', 1)\nsubmit(1)"], ["print('after')"]]
    )
    async with AsyncSession(model=model, backend=FAST, output=int) as s:
        sub = s.events()
        first = await s.run("answer", branches=2, choose="vote")
        assert first.ok
        await s.run("again")  # on the winner's kernel, now the session's own
        events = drain(sub)
    streamed: dict[str | None, str] = {}
    for e in events:
        if isinstance(e, ev.OutputChunk):
            streamed[e.branch] = streamed.get(e.branch, "") + e.text
    assert streamed == {"1.0": "out 0\n", "1.1": "out 1\n", None: "after\n"}
    started = [e.branch for e in events if isinstance(e, ev.CellStarted)]
    assert sorted(started[:2], key=str) == ["1.0", "1.1"] and started[2:] == [None]
