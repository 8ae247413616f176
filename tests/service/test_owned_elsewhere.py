"""A session another live server runs is a 503 with Retry-After, never a 409 a client cannot act on."""

from __future__ import annotations

from collections.abc import Callable

from sunroom.providers import AssistantMessage, Model, TextPart, ToolCall
from sunroom.providers.fakes import ScriptedModel

from .conftest import Server


def _slow_model() -> Model:
    # a run that stays open: one long cell, then an answer
    cell = AssistantMessage(
        [ToolCall("c1", "execute_code", {"code": "import time; time.sleep(30)"})]
    )
    return ScriptedModel([cell, AssistantMessage([TextPart("done")])])


def test_a_session_run_by_another_live_server_is_503_with_retry_after(
    make_server: Callable[..., Server],
) -> None:
    owner = make_server(_slow_model, lease_s=30.0)
    sid = owner.client.post("/sessions", json={"task": "work"}).json()["session_id"]
    other = make_server(_slow_model, lease_s=30.0, resume_orphans=False)  # same database
    r = other.client.post(f"/sessions/{sid}/messages", json={"text": "hello"})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "OwnedElsewhereError"
    wait = int(r.headers["Retry-After"])
    assert 1 <= wait <= 31
    # the owner itself answers
    assert owner.client.post(f"/sessions/{sid}/messages", json={"text": "hi"}).status_code == 202
