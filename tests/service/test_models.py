"""How the service builds models: the registry's specs, and no environment switch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sunroom.providers import OpenAIChatModel
from sunroom.service import resolve_model
from tests.service.conftest import Server


def test_no_environment_variable_replaces_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "r.json").write_text(json.dumps(["scripted"]))
    monkeypatch.setenv("SUNROOM_FAKE_MODEL", str(tmp_path / "r.json"))
    built = resolve_model("openai-compatible:llama3.2", "http://127.0.0.1:9/v1")
    assert isinstance(built, OpenAIChatModel)
    assert resolve_model(f"scripted:{tmp_path / 'r.json'}", None).name == "scripted"


def test_a_client_cannot_point_the_server_at_a_script_file(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    (tmp_path / "demo.json").write_text(json.dumps(["from the demo script"]))
    (tmp_path / "private.json").write_text(json.dumps(["a private file of the server"]))
    server = make_server(resolve=resolve_model, default_model=f"scripted:{tmp_path / 'demo.json'}")
    r = server.client.post(
        "/sessions", json={"task": "t", "model": f"scripted:{tmp_path / 'private.json'}"}
    )
    assert r.status_code == 422, r.text
    assert "scripted" in r.json()["error"]["message"]
    assert "private file" not in r.text
    assert server.client.get("/sessions").json()["sessions"] == []
    for body in ({"task": "t"}, {"task": "t", "model": f"scripted:{tmp_path / 'demo.json'}"}):
        sid = server.client.post("/sessions", json=body).json()["session_id"]
        r = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20})
        assert r.json()["result"]["output"] == "from the demo script"
