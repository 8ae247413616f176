"""MCP servers in the service (bound by name from its config) and in `sunroom exec --mcp`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sunroom.providers import ScriptedModel
from sunroom.service import ServiceConfig
from sunroom.store import SQLiteStore
from tests.mcp.test_binding import CANARY, SERVER
from tests.service.conftest import Server, code, make_server

pytestmark = pytest.mark.usefixtures("no_process_left")
__all__ = ["make_server"]  # the service suite's fixture, used here too

CONFIG = {
    "tracker": {
        "command": sys.executable,
        "args": [SERVER, "stdio"],
        "env": {"TOOLSERVER_TOKEN": CANARY},
    }
}


def test_kernels_and_sessions_bind_configured_servers_by_name(
    make_server: Callable[..., Server],
) -> None:
    model = ScriptedModel([code("print(tracker.add(40, 2))"), "done"])
    server = make_server(model, mcp_servers=CONFIG)
    assert CANARY not in repr(server.config)
    r = server.client.post("/kernels", json={"mcp": ["tracker"]})
    assert r.status_code == 201, r.text
    kid = r.json()["kernel_id"]
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": "tracker.add(1, 2)"}).json()
    assert out["value"] == "3", out
    assert server.client.delete(f"/kernels/{kid}").status_code == 200

    r = server.client.post("/kernels", json={"mcp": ["nope"]})
    assert r.status_code == 422
    assert "unknown MCP server 'nope'; this server has: tracker" in r.json()["error"]["message"]

    sid = server.client.post("/sessions", json={"task": "add", "mcp": ["tracker"]}).json()[
        "session_id"
    ]
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 30}).json()["result"]
    assert result["status"] == "success", result

    async def calls() -> list[Any]:
        async with SQLiteStore(server.config.db_path) as store:
            return await store.calls(sid)

    records = asyncio.run(calls())
    assert [(c.name, c.args, c.outcome) for c in records] == [
        ("tracker.add", {"a": 40, "b": 2}, "ok")
    ]
    server.client.delete(f"/sessions/{sid}")


def test_a_server_that_cannot_start_is_503_and_nothing_is_left(
    make_server: Callable[..., Server],
) -> None:
    broken = {"broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}}
    server = make_server(ScriptedModel(["done"]), mcp_servers=broken)
    r = server.client.post("/kernels", json={"mcp": ["broken"]})
    assert r.status_code == 503, r.text
    assert "the MCP server 'broken' could not be started" in r.json()["error"]["message"]


def test_bad_mcp_config_is_refused_at_startup() -> None:
    with pytest.raises(ValueError, match="give 'command'"):
        ServiceConfig(mcp_servers={"x": {"cmd": "y"}})
    with pytest.raises(ValueError, match="must be a Python identifier"):
        ServiceConfig(mcp_servers={"my-server": {"command": "y"}})


def test_exec_binds_servers_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": CONFIG}))
    script = tmp_path / "job.py"
    script.write_text("print(tracker.search_issues('bug', limit=1))\ntracker.add(2, 3)\n")
    done = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "exec", str(script), "--backend", "subprocess",
         "--mcp", str(config)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["#1 bug (open)", "5"]
    assert CANARY not in done.stdout + done.stderr
    config.write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "exec", str(script), "--backend", "subprocess",
         "--mcp", str(config)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert 'needs an object under "mcpServers"' in done.stderr
