"""The idle policy (issue 26, item 1): idle sessions give their kernel and their slot back.

Real server on loopback, real subprocess kernels, scripted models. A finished session no longer
holds a ``max_sessions`` slot and a kernel for ever: the least recently used idle one is released
when a new session needs its slot, and any idle one after ``session_idle_s``; its next message
resumes it from its log as after a crash (``KernelRestarted``, ``state_lost``). A session that
runs a turn or waits on an approval is never released.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import psutil

from sunroom.providers import AssistantMessage, Model, ScriptedModel
from tests.service.conftest import Server, code
from tests.service.test_routes import sse

PID = "import os\nprint(os.getpid())"


def _children() -> set[int]:
    """Pids of this process's descendants (the in-process server's kernels among them)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _wait(what: str, ok: Callable[[], bool], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _result(server: Server, sid: str) -> dict[str, Any]:
    body: dict[str, Any] = server.client.get(
        f"/sessions/{sid}/result", params={"timeout": 30}
    ).json()
    assert body["status"] != "running", body
    return body


def _kernel_pid(server: Server, sid: str) -> int:
    out = next(e for e in sse(server, sid, after=0) if e["event"] == "ExecutionFinished")
    return int(out["data"]["output"].strip())


def _health(server: Server) -> dict[str, Any]:
    body: dict[str, Any] = server.anon.get("/healthz").json()
    return body


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_session_past_64_finished_ones_is_created_and_the_oldest_idle_one_released(
    make_server: Callable[..., Server],
) -> None:
    """Before: 64 finished sessions kept their slots and kernels; the 65th got 429."""

    def model() -> Model:
        return ScriptedModel([code(PID), "done"])

    server = make_server(model)  # the default max_sessions (64) and session_idle_s (600 s)
    before = _children()
    with httpx.Client(base_url=server.url, headers=server.client.headers, timeout=60) as client:
        sids = []
        for _ in range(64):
            r = client.post("/sessions", json={"task": "t"})
            assert r.status_code == 201, r.text
            sids.append(r.json()["session_id"])
        for sid in sids:
            assert _result(server, sid)["status"] == "finished"
    pids = [_kernel_pid(server, sid) for sid in sids]  # reading one uses it: sids[0] is oldest
    assert _health(server)["sessions"] == 64
    held = _children() - before
    r = server.client.post("/sessions", json={"task": "t"})
    assert r.status_code == 201, r.text  # before: 429, "its limit of 64 sessions"
    assert _result(server, r.json()["session_id"])["status"] == "finished"
    _wait("the oldest session's kernel to go", lambda: _gone(pids[0]))
    assert not [pid for pid in pids[1:] if _gone(pid)]  # the others keep theirs
    now = _children() - before
    assert len(now) <= len(held), (len(held), len(now))  # one session's processes left
    health = _health(server)
    assert health["sessions"] == 64 and health["sessions_released"] == 1, health
    assert server.client.get(f"/sessions/{sids[0]}").json()["status"] == "finished"


def test_an_idle_session_is_released_after_its_idle_time_and_resumes_with_state_lost(
    make_server: Callable[..., Server],
) -> None:
    models = [  # the resume builds the session again: a model of its own
        ScriptedModel([code(f"x = 41\n{PID}"), "first done"]),
        ScriptedModel([code("print(x)", 1), "second done"]),
    ]
    server = make_server(lambda: models.pop(0) if len(models) == 2 else models[0],
                         session_idle_s=0.5)  # fmt: skip
    resumed = models[1]
    before = _children()
    sid = server.client.post("/sessions", json={"task": "remember x"}).json()["session_id"]
    assert _result(server, sid)["result"]["output"] == "first done"
    pid = _kernel_pid(server, sid)
    _wait("the idle session's release", lambda: _health(server)["sessions_released"] == 1)
    assert _health(server)["sessions"] == 0
    _wait("its kernel to go", lambda: _gone(pid))
    assert not {p for p in _children() - before if not _gone(p)}  # nothing of it is left
    r = server.client.post(f"/sessions/{sid}/messages", json={"text": "print x"})
    assert r.status_code == 202, r.text
    body = _result(server, sid)
    assert body["result"]["output"] == "second done", body
    events = list(sse(server, sid, after=0))
    restarted = [e["data"] for e in events if e["event"] == "KernelRestarted"]
    assert len(restarted) == 1 and restarted[0]["state_lost"] is True, restarted
    second = [e["data"] for e in events if e["event"] == "ExecutionFinished"][-1]
    assert "NameError" in str(second), second  # a fresh kernel: x is gone
    seen = repr(resumed.requests[-1].messages)  # the old transcript and the note, to the model
    assert "remember x" in seen and "first done" in seen and "The kernel is new" in seen


def test_a_session_running_a_turn_or_waiting_on_an_approval_is_never_released(
    make_server: Callable[..., Server],
) -> None:
    def delete_repo(name: str) -> str:
        """Delete a repository."""
        return f"deleted {name}"

    scripts: dict[str, list[str | AssistantMessage]] = {
        "busy": [code("import time\ntime.sleep(3)\nprint('slept')"), "busy done"],
        "asks": [code("print(delete_repo('x'))"), "asks done"],
    }

    order: list[str] = []

    def fresh() -> Model:
        name = order.pop(0)
        return ScriptedModel(scripts[name])

    server = make_server(fresh, functions=[delete_repo], max_sessions=2, session_idle_s=0.2)
    order.append("busy")
    busy = server.client.post("/sessions", json={"task": "sleep"}).json()["session_id"]
    order.append("asks")
    body = {"task": "delete", "approvals": {"delete_repo": "ask"}, "approval_timeout_s": 60}
    asks = server.client.post("/sessions", json=body).json()["session_id"]
    _wait("the approval request", lambda: bool(server.client.get(
        f"/sessions/{asks}/approvals").json()["approvals"]))  # fmt: skip
    time.sleep(1.0)  # five idle times
    health = _health(server)
    assert health["sessions"] == 2 and health["sessions_released"] == 0, health
    r = server.client.post("/sessions", json={})
    assert r.status_code == 429 and "none of them idle" in r.text, r.text
    (request,) = server.client.get(f"/sessions/{asks}/approvals").json()["approvals"]
    r = server.client.post(f"/sessions/{asks}/approvals/{request['call_id']}", json={"allow": True})
    assert r.status_code == 200, r.text
    assert _result(server, busy)["result"]["output"] == "busy done"
    assert _result(server, asks)["result"]["output"] == "asks done"
    for sid in (busy, asks):
        kinds = [e["event"] for e in sse(server, sid, after=0)]
        assert "KernelRestarted" not in kinds, kinds  # never released while busy


def test_a_session_released_before_its_first_run_is_recorded_cancelled_and_resumes(
    make_server: Callable[..., Server],
) -> None:
    """Its record said ``running``: the release ends it as a crash's resume would (not an
    orphan that the server would resume, and start a kernel for, at once)."""
    models = [ScriptedModel(["never asked"]), ScriptedModel([code("print(1)"), "answered"])]
    server = make_server(lambda: models.pop(0), session_idle_s=0.3)
    sid = server.client.post("/sessions", json={}).json()["session_id"]
    resumed = models[-1]
    _wait("the idle session's release", lambda: _health(server)["sessions_released"] == 1)
    time.sleep(1.5)  # a few orphan scans (lease_s 2): it is not taken up again
    health = _health(server)
    assert health["sessions"] == 0 and health["sessions_idle"] == 0, health
    record = server.client.get(f"/sessions/{sid}").json()
    assert record["status"] == "cancelled" and record["owner"] is None, record
    r = server.client.post(f"/sessions/{sid}/messages", json={"text": "hello"})
    assert r.status_code == 202, r.text
    body = _result(server, sid)
    assert body["status"] == "finished" and body["result"]["output"] == "answered", body
    kinds = [e["event"] for e in sse(server, sid, after=0)]
    assert kinds[0] == "KernelStarted" and kinds.count("KernelRestarted") == 1, kinds
    assert "The kernel is new" in repr(resumed.requests[0].messages)
