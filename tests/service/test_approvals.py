"""Approvals over HTTP (a real uvicorn on loopback), and a service killed while a call waits."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pydantic
import pytest

from sunroom.agent.approvals import MAX_REASON_CHARS, MAX_TIMEOUT_S
from sunroom.providers import ScriptedModel, UserMessage
from sunroom.service.recovery import RESTART_DENIAL, replay
from sunroom.service.schemas import MAX_APPROVAL_RULES, ApprovalIn, CreateSession
from tests.service.conftest import Server, code
from tests.service.test_crash import Service, read, wait_for
from tests.service.test_resume_messages import _env
from tests.service.test_routes import sse

DELETED: list[str] = []


def delete_repo(name: str) -> str:
    """Delete a repository (a stand-in with a side effect)."""
    DELETED.append(name)
    return f"deleted {name}"


CALL = (
    "try:\n"
    "    print(delete_repo(name='x'))\n"
    "except PermissionError as e:\n"
    "    print(type(e).__name__, '|', e)"
)


def _pending(server: Server, sid: str) -> list[dict[str, object]]:
    r = server.client.get(f"/sessions/{sid}/approvals")
    assert r.status_code == 200, r.text
    approvals: list[dict[str, object]] = r.json()["approvals"]
    return approvals


def _wait_pending(server: Server, sid: str) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while not (pending := _pending(server, sid)):
        assert time.monotonic() < deadline, "no approval request came"
        time.sleep(0.05)
    (request,) = pending
    return request


def test_approval_routes_ask_answer_and_stream(make_server: Callable[..., Server]) -> None:
    DELETED.clear()
    model = ScriptedModel([code(CALL), "done"])
    server = make_server(model, functions=[delete_repo])
    body = {"task": "go", "approvals": {"delete_*": "ask"}, "approval_timeout_s": 60}
    r = server.client.post("/sessions", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    request = _wait_pending(server, sid)
    assert request["name"] == "delete_repo" and request["arguments"] == {"name": "x"}
    expires = request["expires_at"]
    assert isinstance(expires, float) and expires > time.time() + 50
    streamed = next(e for e in sse(server, sid) if e["event"] == "ApprovalRequested")
    assert streamed["data"]["call_id"] == request["call_id"]
    assert streamed["data"]["arguments"] == {"name": "x"}
    base = f"/sessions/{sid}/approvals"
    r = server.client.post(f"{base}/nope", json={"allow": True})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError", r.text
    r = server.client.post(f"{base}/{request['call_id']}", json={"allow": "yes"})
    assert r.status_code == 422, r.text
    r = server.client.post(f"{base}/{request['call_id']}", json={"allow": True, "reason": "ok"})
    assert r.status_code == 200, r.text
    r = server.client.post(f"{base}/{request['call_id']}", json={"allow": True})
    assert r.status_code == 409 and "already answered" in r.text, r.text
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 30}).json()
    assert result["result"]["status"] == "success", result
    assert DELETED == ["x"]
    assert "deleted x" in repr(model.requests[1].messages[-1])
    kinds = [e["event"] for e in sse(server, sid, after=0) if e["event"].startswith("Approval")]
    assert kinds == ["ApprovalRequested", "ApprovalAnswered"]
    assert _pending(server, sid) == []
    assert server.client.get("/sessions/nope/approvals").status_code == 404


def test_an_http_denial_reaches_the_kernel_and_policies_are_strings_only(
    make_server: Callable[..., Server],
) -> None:
    DELETED.clear()
    model = ScriptedModel([code(CALL), "done"])
    server = make_server(model, functions=[delete_repo])
    r = server.client.post("/sessions", json={"task": "go", "approvals": {"x": "maybe"}})
    assert r.status_code == 422, r.text
    r = server.client.post("/sessions", json={"task": "go", "approvals": {"delete_repo": "ask"}})
    sid = r.json()["session_id"]
    request = _wait_pending(server, sid)
    r = server.client.post(
        f"/sessions/{sid}/approvals/{request['call_id']}",
        json={"allow": False, "reason": "not today"},
    )
    assert r.status_code == 200, r.text
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 30}).json()
    assert result["result"]["status"] == "success", result
    shown = repr(model.requests[1].messages[-1])
    assert "ApprovalDenied | delete_repo() was not approved: not today" in shown
    assert DELETED == []


CHARGE = "try:\n    print(charge(amount=5))\nexcept PermissionError as e:\n    print('denied', e)"


def test_a_call_waiting_for_approval_when_the_service_dies_is_denied_and_told(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path, {"replies": [{"code": CHARGE}, "done"]})
    db = tmp_path / "s.db"
    service = Service(tmp_path, env, lease_s=60)
    body = {"task": "charge it", "approvals": {"charge": "ask"}}
    sid = service.client.post("/sessions", json=body).json()["session_id"]
    wait_for(lambda: any(e.kind == "ApprovalRequested" for e in read(db, sid)[0]))
    service.kill()  # kill -9 while the call waits
    service = Service(tmp_path, env, lease_s=60)
    try:
        wait_for(lambda: any(e.kind == "KernelRestarted" for e in read(db, sid)[0]), timeout=20)
        r = service.client.get(f"/sessions/{sid}/result", params={"timeout": 30})
        result = r.json()
        assert service.client.get(f"/sessions/{sid}/approvals").json()["approvals"] == []
    finally:
        service.stop()
    assert result["status"] == "finished" and result["result"]["status"] == "success", result
    events, calls = read(db, sid)
    (asked,) = [e for e in events if e.kind == "ApprovalRequested"]
    (answered,) = [e for e in events if e.kind == "ApprovalAnswered"]
    assert answered.payload["call_id"] == asked.payload["call_id"]
    assert (answered.payload["allow"], answered.payload["reason"]) == (False, RESTART_DENIAL)
    restarted = next(e for e in events if e.kind == "KernelRestarted")
    assert restarted.payload["denied_approvals"] == [asked.payload["call_id"]]
    assert calls == []  # the call never started: no call record, nothing unknown
    assert not (tmp_path / "ledger.txt").exists()  # charge() never ran
    kinds = [e.kind for e in events]
    assert kinds.count("CodeSubmitted") == 1 and "ExecutionFinished" not in kinds  # not re-run
    told = json.dumps([m.text for m in replay(events).transcript if isinstance(m, UserMessage)])
    assert f"(approval {asked.payload['call_id']}) was waiting" in told
    assert "did NOT run" in told


def test_http_approval_options_have_limits() -> None:
    rules = {f"f{i}": "ask" for i in range(MAX_APPROVAL_RULES)}
    assert len(CreateSession.model_validate({"approvals": rules}).approvals) == MAX_APPROVAL_RULES
    for bad in (
        {"approvals": {**rules, "one_more": "ask"}},
        {"approvals": {"x" * 201: "ask"}},
        {"approvals": {"": "ask"}},
        {"approvals": {"x": "maybe"}},
        {"approval_timeout_s": 0},
        {"approval_timeout_s": MAX_TIMEOUT_S + 1},
    ):
        with pytest.raises(pydantic.ValidationError):
            CreateSession.model_validate(bad)
    with pytest.raises(pydantic.ValidationError):
        ApprovalIn.model_validate({"allow": False, "reason": "r" * (MAX_REASON_CHARS + 1)})
    assert ApprovalIn.model_validate({"allow": False}).lease is False
