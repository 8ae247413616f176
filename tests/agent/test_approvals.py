"""Approvals end to end: policies, ask → answer, deadlines, leases; real subprocess kernels."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from sunroom import AsyncKernel
from sunroom.agent import AsyncSession, Session
from sunroom.agent import events as ev
from sunroom.agent.approvals import (
    MAX_REASON_CHARS,
    MAX_TIMEOUT_S,
    Action,
    ApprovalCall,
    Approvals,
    Decision,
    Policy,
    policy_for,
)
from sunroom.agent.bus import Subscription
from sunroom.errors import ApprovalNotPending, UsageError
from sunroom.providers import AssistantMessage, FunctionModel, Request, ScriptedModel
from sunroom.providers.fakes import Reply
from sunroom.sandbox.functions import HostFunction, host_function
from sunroom.sandbox.limits import Limits
from tests.agent.conftest import code, last_output

FAST = "subprocess"

DELETED: list[str] = []


def delete_repo(name: str) -> str:
    """Delete a repository (a stand-in with a side effect)."""
    DELETED.append(name)
    return f"deleted {name}"


def get_repo(name: str) -> str:
    """Read a repository."""
    return f"repo {name}"


CALL = (
    "try:\n"
    "    print(delete_repo(name='x'))\n"
    "except PermissionError as e:\n"
    "    print(type(e).__name__, '|', e)"
)


async def _next_request(sub: Subscription) -> ev.ApprovalRequested:
    async for event in sub:
        if isinstance(event, ev.ApprovalRequested):
            return event
    raise AssertionError("the session ended without a request")


async def _run(
    policy: Mapping[str, Policy] | None, fn: HostFunction | Callable[..., Any] = delete_repo
) -> tuple[str, list[ev.Event]]:
    model = ScriptedModel([code(CALL), "done"])
    async with AsyncSession(model=model, backend=FAST, functions=[fn], approvals=policy) as s:
        sub = s.events()
        result = await s.run("go")
        events = [e async for e in _drain(sub)]
    assert result.ok, result
    return last_output(model.requests[1]), events


async def _drain(sub: Subscription) -> AsyncIterator[ev.Event]:
    async for event in sub:
        yield event
        if isinstance(event, ev.SessionEnded):
            return


async def test_allow_runs_the_call() -> None:
    DELETED.clear()
    shown, events = await _run({"delete_repo": "allow"})
    assert shown.strip() == "deleted x" and DELETED == ["x"]
    assert not [e for e in events if isinstance(e, ev.ApprovalRequested | ev.Vetoed)]


async def test_deny_raises_a_permission_error_in_the_kernel() -> None:
    DELETED.clear()
    shown, events = await _run({"delete_repo": "deny"})
    assert (
        shown.strip() == "ApprovalDenied | delete_repo() was denied: denied by the approval policy"
    )
    assert DELETED == []
    assert [(e.what, e.reason) for e in events if isinstance(e, ev.Vetoed)] == [
        ("delete_repo", "denied by the approval policy")
    ]


async def test_registration_policy_applies_when_the_session_names_nothing() -> None:
    DELETED.clear()
    fn = host_function(delete_repo, approval="deny")
    shown, _ = await _run(None, fn)
    assert "ApprovalDenied" in shown and DELETED == []
    shown, _ = await _run({"delete_*": "allow"}, fn)  # the session's glob wins
    assert shown.strip() == "deleted x"


async def _ask_and_answer(
    *, allow: bool, reason: str | None = None, wait_s: float = 0.0, limits: Limits | None = None
) -> tuple[str, list[ev.Event], AsyncSession]:
    model = ScriptedModel([code(CALL), "done"])
    s = AsyncSession(
        model=model,
        backend=FAST,
        functions=[delete_repo],
        approvals={"delete_*": "ask"},
        limits=limits,
    )
    async with s:
        sub = s.events()
        await s.send("go")
        request = await _next_request(sub)
        assert (request.name, request.arguments) == ("delete_repo", {"name": "x"})
        assert [p.call_id for p in s.pending_approvals()] == [request.call_id]
        await asyncio.sleep(wait_s)
        await s.approve(request.call_id, allow=allow, reason=reason)
        result = await s.result()
        events = [e async for e in _drain(sub)]
        assert result.ok, result
        assert s.pending_approvals() == ()
        with pytest.raises(ApprovalNotPending, match="already answered") as info:
            await s.approve(request.call_id, allow=True)
        assert info.value.answered
    return last_output(model.requests[1]), events, s


async def test_ask_then_approve_runs_the_call() -> None:
    DELETED.clear()
    shown, events, _ = await _ask_and_answer(allow=True)
    assert shown.strip() == "deleted x" and DELETED == ["x"]
    (answer,) = [e for e in events if isinstance(e, ev.ApprovalAnswered)]
    assert (answer.allow, answer.by, answer.reason) == (True, "person", "approved")


async def test_ask_then_deny_raises_with_the_reason() -> None:
    DELETED.clear()
    shown, events, _ = await _ask_and_answer(allow=False, reason="not on Fridays")
    assert shown.strip() == "ApprovalDenied | delete_repo() was not approved: not on Fridays"
    assert DELETED == []
    (answer,) = [e for e in events if isinstance(e, ev.ApprovalAnswered)]
    assert (answer.allow, answer.reason) == (False, "not on Fridays")


async def test_the_cell_timeout_does_not_run_while_waiting_for_approval() -> None:
    DELETED.clear()
    started = time.perf_counter()
    shown, _, _ = await _ask_and_answer(allow=True, wait_s=2.0, limits=Limits(timeout_s=1.0))
    assert time.perf_counter() - started >= 2.0
    assert shown.strip() == "deleted x" and DELETED == ["x"]


async def test_the_cell_timeout_still_runs_outside_the_wait() -> None:
    loop_code = "delete_repo(name='x')\nwhile True:\n    pass"
    model = ScriptedModel([code(loop_code), "done"])
    async with AsyncSession(
        model=model,
        backend=FAST,
        functions=[delete_repo],
        approvals={"delete_repo": "ask"},
        limits=Limits(timeout_s=1.0),
    ) as s:
        sub = s.events()
        await s.send("go")
        request = await _next_request(sub)
        await asyncio.sleep(1.5)
        started = time.perf_counter()
        await s.approve(request.call_id)
        result = await s.result()
    assert result.ok
    assert "TimeoutError" in last_output(model.requests[1])
    assert time.perf_counter() - started < 5.0


async def test_no_answer_in_time_is_a_denial() -> None:
    DELETED.clear()
    model = ScriptedModel([code(CALL), "done"])
    async with AsyncSession(
        model=model,
        backend=FAST,
        functions=[delete_repo],
        approvals={"delete_repo": "ask"},
        approval_timeout_s=0.5,
    ) as s:
        sub = s.events()
        result = await s.run("go")
        events = [e async for e in _drain(sub)]
    assert result.ok
    assert last_output(model.requests[1]).strip() == (
        "ApprovalDenied | delete_repo() was not approved: no answer within 0.5 s"
    )
    (answer,) = [e for e in events if isinstance(e, ev.ApprovalAnswered)]
    assert (answer.allow, answer.by) == (False, "timeout")
    assert DELETED == []


async def test_a_lease_allows_the_function_for_the_rest_of_the_run_only() -> None:
    DELETED.clear()
    twice = "print(delete_repo(name='a'))\nprint(delete_repo(name='b'))"
    model = ScriptedModel([code(twice), "done", code("print(delete_repo(name='c'))"), "done"])
    async with AsyncSession(
        model=model, backend=FAST, functions=[delete_repo], approvals={"delete_repo": "ask"}
    ) as s:
        sub = s.events()
        everything = s.events()
        await s.send("go")
        first = await _next_request(sub)
        await s.approve(first.call_id, allow=True, lease=True)
        assert (await s.result()).ok
        assert DELETED == ["a", "b"]
        await s.send("again")  # a new run: the lease is over
        third = await _next_request(sub)
        assert third.arguments == {"name": "c"}
        await s.approve(third.call_id, allow=False)
        assert (await s.result()).ok
        events = [e async for e in _drain(everything)]
        events += [e async for e in _drain(everything)]
    asked = [e.arguments["name"] for e in events if isinstance(e, ev.ApprovalRequested)]
    answers = [(e.allow, e.lease, e.by) for e in events if isinstance(e, ev.ApprovalAnswered)]
    assert asked == ["a", "c"]
    assert answers == [(True, True, "person"), (True, False, "lease"), (False, False, "person")]
    assert DELETED == ["a", "b"]


def test_glob_precedence() -> None:
    mapping: dict[str, Policy] = {
        "github.*": "ask",
        "github.get_*": "allow",
        "github.get_issue": "deny",
        "*": "deny",
        "g?thub.search_*": "ask",
    }
    assert policy_for("github.get_issue", mapping, None) == "deny"  # exact name
    assert policy_for("github.get_pr", mapping, None) == "allow"  # the most specific glob
    assert policy_for("github.delete_repo", mapping, None) == "ask"
    assert policy_for("github.search_issues", mapping, None) == "ask"
    assert policy_for("other", mapping, "allow") == "deny"  # a glob beats registration
    assert policy_for("other", {}, "ask") == "ask"  # registration
    assert policy_for("other", {}, None) == "allow"  # the default
    assert policy_for("submit", {"*": "deny"}, None) == "allow"  # globs skip the built-ins
    assert policy_for("submit", {"submit": "ask"}, None) == "ask"


async def test_callable_policies_sync_and_async() -> None:
    seen: list[ApprovalCall] = []

    def sync_policy(call: ApprovalCall) -> Decision:
        seen.append(call)
        return Decision("deny", f"no {call.arguments['name']}")

    async def async_policy(call: ApprovalCall) -> Action:
        await asyncio.sleep(0)
        return "allow" if call.arguments["name"] == "x" else "deny"

    DELETED.clear()
    shown, _ = await _run({"delete_repo": sync_policy})
    assert shown.strip() == "ApprovalDenied | delete_repo() was denied: no x"
    assert seen[0].name == "delete_repo" and seen[0].depth == 0 and seen[0].session_id
    shown, _ = await _run({"delete_repo": async_policy})
    assert shown.strip() == "deleted x" and DELETED == ["x"]

    def broken(call: ApprovalCall) -> Action:
        raise RuntimeError("oops")

    shown, _ = await _run({"delete_repo": broken})
    assert "denied: the approval policy failed: RuntimeError: oops" in shown


async def test_unknown_call_id_and_bad_options() -> None:
    async with AsyncSession(model=ScriptedModel(["hi"]), backend=FAST) as s:
        with pytest.raises(ApprovalNotPending, match="not one this session asked") as info:
            await s.approve("nope")
        assert not info.value.answered
    with pytest.raises(UsageError, match="approval policy"):
        AsyncSession(model=ScriptedModel([]), backend=FAST, approvals={"x": "maybe"})  # type: ignore[dict-item]
    with pytest.raises(UsageError, match="approval_timeout_s"):
        Approvals({}, timeout_s=MAX_TIMEOUT_S + 1)
    with pytest.raises(UsageError, match="approval_timeout_s"):
        Approvals({}, timeout_s=0)
    with pytest.raises(UsageError, match="approval must be"):
        host_function(get_repo, approval="sometimes")  # type: ignore[call-overload]
    broker = Approvals({})
    with pytest.raises(UsageError, match=f"at most {MAX_REASON_CHARS}"):
        broker.answer("x", allow=False, reason="r" * (MAX_REASON_CHARS + 1))


def test_sync_twin_approves() -> None:
    DELETED.clear()
    model = ScriptedModel([code(CALL), "done"])
    with Session(
        model=model, backend=FAST, functions=[delete_repo], approvals={"delete_repo": "ask"}
    ) as s:
        events = s.events()
        s.send("go")
        request = next(e for e in events if isinstance(e, ev.ApprovalRequested))
        assert [p.call_id for p in s.pending_approvals()] == [request.call_id]
        s.approve(request.call_id, allow=True)
        assert s.result().ok
        events.close()
    assert DELETED == ["x"]


async def test_a_nested_session_asks_on_its_root_and_secrets_stay_redacted() -> None:
    nested = ScriptedModel([code("submit(len(input))")])
    root = ScriptedModel(
        [code("print(predict('count', 'abcdef', output=int, recursive=True))"), "ok"]
    )
    async with AsyncSession(
        model=root, sub_model=nested, backend=FAST, max_depth=2, approvals={"submit": "ask"}
    ) as s:
        sub = s.events()
        await s.send("go")
        request = await _next_request(sub)
        assert (request.name, request.depth, request.arguments) == ("submit", 1, {"value": 6})
        await s.approve(request.call_id)
        assert (await s.result()).ok
    assert last_output(root.requests[1]).strip() == "6"

    secret = "s3cr3t-branch-name"
    model = ScriptedModel([code(f"delete_repo(name={secret!r})"), "done"])
    async with AsyncSession(
        model=model,
        backend=FAST,
        functions=[delete_repo],
        approvals={"delete_repo": "ask"},
        secrets={"token": secret},
    ) as s:
        sub = s.events()
        await s.send("go")
        request = await _next_request(sub)
        (pending,) = s.pending_approvals()
        assert secret not in repr(request) and secret not in repr(pending)
        await s.approve(request.call_id, allow=False, reason=f"not {secret}")
        assert (await s.result()).ok
    assert secret not in last_output(model.requests[1])


async def test_branches_ask_on_their_session() -> None:
    DELETED.clear()

    def agent(request: Request) -> Reply:
        done = any(isinstance(m, AssistantMessage) for m in request.messages)
        return "done" if done else code("print(delete_repo(name='x'))")

    async with AsyncSession(
        model=FunctionModel(agent),
        backend=FAST,
        functions=[delete_repo],
        approvals={"delete_repo": "ask"},
    ) as s:
        sub = s.events()
        run = asyncio.create_task(s.run("go", branches=2, choose="vote"))
        first, second = await _next_request(sub), await _next_request(sub)
        assert {first.branch, second.branch} == {"1.0", "1.1"}
        assert {p.call_id for p in s.pending_approvals()} == {first.call_id, second.call_id}
        await s.approve(first.call_id)
        await s.approve(second.call_id, allow=True, lease=True)
        result = await run
    assert result.ok, result
    assert DELETED == ["x", "x"]


async def test_a_kernel_outside_a_session_fails_closed() -> None:
    DELETED.clear()
    functions = [host_function(delete_repo, approval="ask"), host_function(get_repo)]
    async with AsyncKernel(backend=FAST, functions=functions) as k:
        denied = await k.execute(CALL)
        allowed = await k.execute("print(get_repo(name='y'))")
    assert denied.stdout.strip() == (
        "ApprovalDenied | delete_repo() needs approval and this kernel has no agent session "
        "to give it"
    )
    assert allowed.stdout.strip() == "repo y" and DELETED == []
