"""MCP tools in agent sessions: the prompt lists them, calls pass hooks, events and redaction."""

from __future__ import annotations

import sys

import pytest

import sunroom
from sunroom import AsyncSession, Hooks
from sunroom.agent import Veto
from sunroom.agent import events as ev
from sunroom.providers import ScriptedModel, SystemMessage
from tests.agent.conftest import code, collect, last_output
from tests.mcp.test_binding import CANARY, SERVER

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("no_process_left")]


def tracker() -> sunroom.mcp.StdioServer:
    return sunroom.mcp.stdio(
        sys.executable, [SERVER, "stdio"], name="tracker", env={"TOOLSERVER_TOKEN": CANARY}
    )


async def test_the_prompt_lists_modules_and_calls_are_events_vetted_by_hooks() -> None:
    async def before_host_call(name: str, args: object) -> Veto | None:
        return Veto("no new issues") if name == "tracker.create_issue" else None

    model = ScriptedModel(
        [
            code("print(tracker.add(20, 22))"),
            code("tracker.create_issue({'title': 't', 'author': {'name': 'a'}})"),
            "done",
        ]
    )
    hooks = Hooks(before_host_call=before_host_call)
    async with AsyncSession(model=model, backend="subprocess", mcp=[tracker()], hooks=hooks) as s:
        sub = s.events()
        result = await s.run("use the tracker")
        events = await collect(sub)
    assert result.ok
    system = model.requests[0].messages[0]
    assert isinstance(system, SystemMessage)
    assert "MCP tools, one module per server" in system.text
    assert "# module tracker (MCP server)" in system.text
    assert "tracker.search_issues(query: str, limit: int=5" in system.text
    assert "class NewIssue:" in system.text  # the types its arguments use
    assert "# Search issues by text." in system.text
    assert "inputSchema" not in system.text and "$defs" not in system.text
    assert CANARY not in repr(model.requests)
    assert "42" in last_output(model.requests[1])
    assert "tracker.create_issue() was vetoed: no new issues" in last_output(model.requests[2])
    calls = [e.name for e in events if isinstance(e, ev.HostCallFinished)]
    assert calls == ["tracker.add"]
    assert [(e.what, e.reason) for e in events if isinstance(e, ev.Vetoed)] == [
        ("tracker.create_issue", "no new issues")
    ]


async def test_approval_policies_apply_to_mcp_tools_by_their_dotted_names() -> None:
    model = ScriptedModel(
        [
            code("print(tracker.add(1, 2))"),
            code("print(tracker.search_issues('x', limit=1))"),
            "done",
        ]
    )
    async with AsyncSession(
        model=model,
        backend="subprocess",
        mcp=[tracker()],
        approvals={"tracker.*": "deny", "tracker.add": "allow"},
    ) as s:
        result = await s.run("go")
    assert result.ok
    assert "3" in last_output(model.requests[1])
    denied = last_output(model.requests[2])
    assert "ApprovalDenied" in denied
    assert "tracker.search_issues" in denied


async def test_a_lazy_server_is_bound_by_the_sessions_setup_cell_and_listed() -> None:
    lazy = sunroom.mcp.stdio(sys.executable, [SERVER, "stdio"], name="tracker", start="lazy")
    model = ScriptedModel([code("print(tracker.add(2, 2))"), "done"])
    async with AsyncSession(model=model, backend="subprocess", mcp=[lazy]) as s:
        result = await s.run("go")
    assert result.ok
    system = model.requests[0].messages[0]
    assert isinstance(system, SystemMessage)
    assert "tracker.add(a: int, b: int) -> int" in system.text
    assert "4" in last_output(model.requests[1])
