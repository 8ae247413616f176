"""``code_mode``: ``tool`` (the execute_code tool) or ``fenced`` (```python blocks, no tools)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sunroom.providers import ScriptedModel, SystemMessage
from sunroom.store import SQLiteStore
from tests.service.conftest import Server


def events(server: Server, sid: str) -> list[dict[str, object]]:
    import asyncio

    async def go() -> list[dict[str, object]]:
        async with SQLiteStore(server.config.db_path) as store:
            return [{"type": e.kind, **e.payload} for e in await store.events(sid)]

    return asyncio.run(go())


def test_fenced_code_mode_offers_no_tool_and_runs_fenced_blocks(
    make_server: Callable[..., Server],
) -> None:
    model = ScriptedModel(["Let me see.\n\n```python\nx = 6 * 7\nprint(x)\n```", "42"])
    server = make_server(model)
    r = server.client.post("/sessions", json={"task": "compute", "code_mode": "fenced"})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    body = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20}).json()
    assert body["result"]["status"] == "success" and body["result"]["output"] == "42"
    assert all(request.tools == () for request in model.requests)
    first = model.requests[0].messages[0]
    assert isinstance(first, SystemMessage)
    system = first.text
    assert "```python" in system and "execute_code" not in system
    cells = [e for e in events(server, sid) if e["type"] == "CodeSubmitted"]
    assert [c["via"] for c in cells] == ["fenced"]
    assert server.client.get(f"/sessions/{sid}").json()["config"]["code_mode"] == "fenced"


def test_tool_code_mode_is_the_default_and_code_mode_is_checked(
    make_server: Callable[..., Server],
) -> None:
    model = ScriptedModel(["done"])
    server = make_server(model)
    sid = server.client.post("/sessions", json={"task": "t"}).json()["session_id"]
    server.client.get(f"/sessions/{sid}/result", params={"timeout": 20})
    assert [t.name for t in model.requests[0].tools] == ["execute_code"]
    r = server.client.post("/sessions", json={"task": "t", "code_mode": "telepathy"})
    assert r.status_code == 422 and "code_mode" in r.json()["error"]["message"]


def test_a_resumed_session_keeps_its_code_mode(tmp_path: Path) -> None:
    from sunroom.service.schemas import CreateSession

    stored = CreateSession(task="t", code_mode="fenced").model_dump(mode="json")
    assert CreateSession.model_validate(json.loads(json.dumps(stored))).code_mode == "fenced"
    old = {k: v for k, v in stored.items() if k != "code_mode"}  # recorded before code_mode
    assert CreateSession.model_validate(old).code_mode == "tool"
