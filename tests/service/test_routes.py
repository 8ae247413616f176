"""Every route of the service against a real uvicorn on loopback, real kernels, fake models."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sunroom.providers import ScriptedModel
from sunroom.store import SQLiteStore, idempotency_key
from tests.service.conftest import TOKEN, Server, code

ROUTES = [
    ("POST", "/sessions"),
    ("GET", "/sessions"),
    ("GET", "/sessions/x"),
    ("DELETE", "/sessions/x"),
    ("POST", "/sessions/x/messages"),
    ("GET", "/sessions/x/events"),
    ("GET", "/sessions/x/result"),
    ("GET", "/sessions/x/approvals"),
    ("POST", "/sessions/x/approvals/y"),
    ("POST", "/kernels"),
    ("GET", "/kernels"),
    ("POST", "/kernels/x/execute"),
    ("POST", "/kernels/x/fork"),
    ("DELETE", "/kernels/x"),
]


def sse(server: Server, sid: str, *, after: int | None = None) -> Iterator[dict[str, Any]]:
    headers = {} if after is None else {"Last-Event-ID": str(after)}
    with server.client.stream("GET", f"/sessions/{sid}/events", headers=headers) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        event: dict[str, Any] = {}
        for line in resp.iter_lines():
            if not line:
                if event:
                    yield event
                event = {}
                continue
            field, _, value = line.partition(": ")
            if field == "data":
                event["data"] = json.loads(value)
            elif field in ("id", "event"):
                event[field] = value


def test_every_route_but_health_needs_the_token(make_server: Callable[..., Server]) -> None:
    server = make_server()
    health = server.anon.get("/healthz")
    assert health.status_code == 200 and health.json()["ok"] is True
    for method, path in ROUTES:
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-wrong-token"},
            {"Authorization": TOKEN},
        ):
            r = server.anon.request(method, path, headers=headers, json={})
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.json()["error"]["type"] == "Unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
        r = server.anon.request(method, path, params={"token": TOKEN, "access_token": TOKEN})
        assert r.status_code == 401, (method, path)


def test_session_runs_streams_continues_and_is_deleted(make_server: Callable[..., Server]) -> None:
    model = ScriptedModel([code("x = 6 * 7\nprint(x)"), "forty-two", code("print(x + 1)", 1), "43"])
    server = make_server(model)
    r = server.client.post("/sessions", json={"task": "compute"})
    assert r.status_code == 201
    sid = r.json()["session_id"]
    r = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20})
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "finished"
    assert body["result"]["status"] == "success" and body["result"]["output"] == "forty-two"
    assert body["result"]["session_id"] == sid
    events = list(sse(server, sid))
    kinds = [e["event"] for e in events]
    assert kinds[0] == "MessageReceived" and kinds[-1] == "end"
    assert "CodeSubmitted" in kinds and "ExecutionFinished" in kinds and "SessionEnded" in kinds
    assert "Transcript" not in kinds
    finished = next(e for e in events if e["event"] == "ExecutionFinished")
    assert finished["data"]["output"].strip() == "42"
    ids = [int(e["id"]) for e in events if "id" in e]
    assert ids == sorted(set(ids))

    r = server.client.post(f"/sessions/{sid}/messages", json={"text": "and plus one?"})
    assert r.status_code == 202
    r = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20})
    assert r.json()["result"]["output"] == "43"  # the kernel kept x: same session
    listing = server.client.get("/sessions").json()["sessions"]
    assert [s["session_id"] for s in listing] == [sid]
    assert server.client.get(f"/sessions/{sid}").json()["status"] == "finished"

    assert server.client.delete(f"/sessions/{sid}").status_code == 200
    assert server.client.get("/healthz").json()["sessions"] == 0
    for method, path in [("GET", "/sessions/nope"), ("GET", "/sessions/nope/result"),
                         ("DELETE", "/sessions/nope"), ("GET", "/sessions/nope/events"),
                         ("POST", "/kernels/nope/execute"), ("DELETE", "/kernels/nope")]:  # fmt: skip
        body = {"code": "1"} if path.endswith("execute") else None
        r = server.client.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.text)
        assert set(r.json()["error"]) == {"type", "message"}


def test_result_times_out_with_202_and_delete_cancels(make_server: Callable[..., Server]) -> None:
    server = make_server(ScriptedModel([code("import time\ntime.sleep(30)")]))
    sid = server.client.post("/sessions", json={"task": "sleep"}).json()["session_id"]
    r = server.client.get(f"/sessions/{sid}/result", params={"timeout": 0.3})
    assert r.status_code == 202 and r.json()["status"] == "running"
    assert server.client.delete(f"/sessions/{sid}").status_code == 200
    r = server.client.get(f"/sessions/{sid}/result")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_output_schema_is_enforced(make_server: Callable[..., Server]) -> None:
    model = ScriptedModel(
        [code("submit({'count': 'many'})"), code("submit({'count': 3, 'names': ['a']})", 1)]
    )
    server = make_server(model)
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "names": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["count"],
    }
    sid = server.client.post(
        "/sessions", json={"task": "count", "preset": "rlm", "output_schema": schema,
                           "inputs": {"doc": "a b c"}, "budget": {"max_model_calls": 5}},
    ).json()["session_id"]  # fmt: skip
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20}).json()["result"]
    assert result["status"] == "success"
    assert result["output"] == {"count": 3, "names": ["a"]}
    kinds = [e["event"] for e in sse(server, sid)]
    assert "SubmitRejected" in kinds and "SubmitAccepted" in kinds


def test_bad_requests_are_json_errors(make_server: Callable[..., Server]) -> None:
    server = make_server(ScriptedModel(["hi"]), max_body_bytes=10_000)
    r = server.client.post(
        "/sessions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["error"]["type"] == "UsageError"
    r = server.client.post("/sessions", json={"preset": "nonsense"})
    assert r.status_code == 422 and r.json()["error"]["type"] == "ValidationError"
    r = server.client.post("/sessions", json={"limits": {"timeout_s": -1}})
    assert r.status_code == 422
    r = server.client.post("/sessions", json={"output_schema": {"type": "frobnicate"}})
    assert r.status_code == 422 and "frobnicate" in r.json()["error"]["message"]
    r = server.client.post("/kernels", json={"backend": "nonsense"})
    assert r.status_code == 422 and "backend" in r.json()["error"]["message"]
    r = server.client.get("/no/such/route")
    assert r.status_code == 404 and "error" in r.json()
    r = server.client.get("/sessions/x/events", headers={"Last-Event-ID": "abc"})
    assert r.status_code in (404, 422)


def test_body_limit_413_declared_and_streamed(make_server: Callable[..., Server]) -> None:
    server = make_server(max_body_bytes=1024)
    big = {"code": "x" * 5000}
    r = server.client.post("/kernels/x/execute", json=big)
    assert r.status_code == 413 and r.json()["error"]["type"] == "BodyTooLarge"

    sent = 0

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked, counted while read
        nonlocal sent
        for _ in range(100):
            sent += 512
            yield b" " * 512

    r = server.client.post(
        "/sessions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["type"] == "BodyTooLarge"


def test_limits_on_sessions_and_kernels_429(make_server: Callable[..., Server]) -> None:
    server = make_server(
        lambda: ScriptedModel([code("import time\ntime.sleep(30)")]), max_sessions=1, max_kernels=1
    )
    first = server.client.post("/sessions", json={"task": "a"})
    assert first.status_code == 201
    r = server.client.post("/sessions", json={"task": "b"})
    assert r.status_code == 429 and r.json()["error"]["type"] == "CapacityError"
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    r = server.client.post("/kernels", json={})
    assert r.status_code == 429
    server.client.delete(f"/kernels/{kid}")
    assert server.client.post("/kernels", json={}).status_code == 201
    server.client.delete(f"/sessions/{first.json()['session_id']}")
    assert server.client.post("/sessions", json={}).status_code == 201


def test_raw_kernels_execute_with_host_functions(make_server: Callable[..., Server]) -> None:
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    server = make_server(functions=[double])
    r = server.client.post("/kernels", json={"inputs": {"n": 21}, "limits": {"timeout_s": 5}})
    assert r.status_code == 201
    kid = r.json()["kernel_id"]
    out = server.client.post(
        f"/kernels/{kid}/execute", json={"code": "print('hi')\ndouble(n)"}
    ).json()
    assert out["ok"] is True and out["stdout"] == "hi\n" and out["value"] == "42"
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": "1/0"}).json()
    assert out["status"] == "error" and out["error"]["type"] == "ZeroDivisionError"
    out = server.client.post(
        f"/kernels/{kid}/execute", json={"code": "while True: pass", "timeout_s": 0.3}
    ).json()
    assert out["status"] == "timeout"
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": "n"}).json()
    assert out["value"] == "21"
    assert server.client.get("/healthz").json()["kernels"] == 1
    assert server.client.delete(f"/kernels/{kid}").status_code == 200
    assert server.client.post(f"/kernels/{kid}/execute", json={"code": "1"}).status_code == 404


def test_raw_kernels_fork(make_server: Callable[..., Server]) -> None:
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    server = make_server(functions=[double], max_kernels=3)
    kid = server.client.post("/kernels", json={"inputs": {"n": 21}}).json()["kernel_id"]
    server.client.post(f"/kernels/{kid}/execute", json={"code": "seen = ['parent']"})
    r = server.client.post(f"/kernels/{kid}/fork", json={"n": 2})
    assert r.status_code == 201, r.text
    copies = r.json()["kernel_ids"]
    assert r.json()["shares_trust_domain_with"] == kid
    assert len(copies) == 2 and kid not in copies
    for i, cid in enumerate(copies):
        out = server.client.post(
            f"/kernels/{cid}/execute", json={"code": f"seen.append({i})\n(seen, double(n))"}
        ).json()
        assert out["value"] == f"(['parent', {i}], 42)", out
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": "seen"}).json()
    assert out["value"] == "['parent']"
    assert server.client.get("/healthz").json()["kernels"] == 3
    r = server.client.post(f"/kernels/{kid}/fork", json={})
    assert r.status_code == 429 and r.json()["error"]["type"] == "CapacityError"
    for bad in ({"n": 0}, {"n": 65}, {"n": "two"}):
        r = server.client.post(f"/kernels/{kid}/fork", json=bad)
        assert r.status_code == 422, bad
    assert server.client.post("/kernels/nope/fork", json={}).status_code == 404
    server.client.delete(f"/kernels/{kid}")  # the copies outlive it
    out = server.client.post(f"/kernels/{copies[0]}/execute", json={"code": "seen"}).json()
    assert out["value"] == "['parent', 0]"
    server.client.post(
        f"/kernels/{copies[1]}/execute",
        json={
            "code": "import threading\nthreading.Thread(target=__import__('time').sleep, "
            "args=(30,), daemon=True, name='sleeper').start()"
        },
    )
    r = server.client.post(f"/kernels/{copies[1]}/fork", json={})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["type"] == "ForkError"
    assert "sleeper" in r.json()["error"]["message"]
    for cid in copies:
        assert server.client.delete(f"/kernels/{cid}").status_code == 200


def test_templates_serve_kernels_and_sessions(make_server: Callable[..., Server]) -> None:
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    model = ScriptedModel([code("print(double(warm))"), "done"])
    server = make_server(
        model,
        functions=[double],
        templates={"warm": "import json\nwarm = 21", "broken": "import no_such_module_here"},
    )
    r = server.client.post("/kernels", json={"template": "warm", "inputs": {"extra": 1}})
    assert r.status_code == 201, r.text
    kid = r.json()["kernel_id"]
    out = server.client.post(
        f"/kernels/{kid}/execute", json={"code": "json.dumps([warm, extra, double(warm)])"}
    ).json()
    assert out["value"] == "'[21, 1, 42]'", out
    r = server.client.post("/kernels", json={"template": "nope"})
    assert r.status_code == 422 and "unknown template 'nope'" in r.json()["error"]["message"]
    assert "broken, warm" in r.json()["error"]["message"]
    r = server.client.post("/kernels", json={"template": "warm", "limits": {"timeout_s": 3}})
    assert r.status_code == 422 and "omit backend and limits" in r.json()["error"]["message"]
    r = server.client.post("/kernels", json={"template": "broken"})
    assert r.status_code == 503, r.text
    assert "setup failed: ModuleNotFoundError" in r.json()["error"]["message"]
    r = server.client.post("/sessions", json={"task": "go", "template": "warm"})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    body = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20}).json()
    assert body["result"]["status"] == "success", body
    finished = next(e for e in sse(server, sid) if e["event"] == "ExecutionFinished")
    assert finished["data"]["output"].strip() == "42"
    server.client.delete(f"/kernels/{kid}")
    server.client.delete(f"/sessions/{sid}")


def test_host_calls_are_recorded_with_idempotency_keys(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    seen: list[tuple[int, str]] = []

    def charge(amount: int, idempotency_key: str) -> str:
        """Charge the card (a side effect)."""
        seen.append((amount, idempotency_key))
        return f"charged {amount}"

    model = ScriptedModel([code("print(charge(5))\nprint(charge(amount=7))"), "done"])
    server = make_server(model, functions=[charge])
    sid = server.client.post("/sessions", json={"task": "pay"}).json()["session_id"]
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20}).json()["result"]
    assert result["status"] == "success"
    assert [a for a, _ in seen] == [5, 7]
    assert seen[0][1] == idempotency_key(sid, "1") and seen[1][1] == idempotency_key(sid, "2")

    async def calls() -> list[Any]:
        async with SQLiteStore(server.config.db_path) as store:
            return await store.calls(sid)

    records = asyncio.run(calls())
    assert [(c.call_id, c.name, c.args, c.outcome, c.side_effect) for c in records] == [
        ("1", "charge", {"amount": 5}, "ok", True),
        ("2", "charge", {"amount": 7}, "ok", True),
    ]


def test_sse_resume_with_last_event_id_loses_and_duplicates_nothing(
    make_server: Callable[..., Server],
) -> None:
    cells = [code(f"print('cell {i}')", i) for i in range(12)]
    server = make_server(ScriptedModel([*cells, "done"]))
    sid = server.client.post("/sessions", json={"task": "many"}).json()["session_id"]
    seen: list[dict[str, Any]] = []
    last = None
    while True:  # read a few events per connection, then drop it and resume
        ended = False
        for got, event in enumerate(sse(server, sid, after=last), start=1):
            if event.get("event") == "end":
                ended = True
                break
            seen.append(event)
            last = int(event["id"])
            if got == 3:
                break
        if ended:
            break
    ids = [int(e["id"]) for e in seen]
    assert len(ids) == len(set(ids)), "duplicated events"

    async def stored() -> list[int]:
        async with SQLiteStore(server.config.db_path) as store:
            return [e.seq for e in await store.events(sid) if e.kind != "Transcript"]

    assert ids == asyncio.run(stored()), "lost events"
    assert seen[-1]["event"] == "SessionEnded"


async def test_a_stalled_sse_client_is_disconnected(tmp_path: Path) -> None:
    from sunroom.service import ServiceConfig
    from sunroom.service.signals import Signals
    from sunroom.service.sse import EventStream
    from sunroom.store import NewEvent

    config = ServiceConfig(
        token=TOKEN, db_path=tmp_path / "s.db", sse_send_timeout_s=0.2, sse_batch=8
    )
    async with SQLiteStore(config.db_path) as store:
        await store.create_session("s", config={}, owner="me", lease_s=60)
        await store.append(
            "s",
            [NewEvent(seq=i, kind="X", payload={"i": i}, ts=0.0) for i in range(1, 100)],
            owner="me",
        )
        sent: list[Any] = []
        never = asyncio.Event()

        async def receive() -> Any:
            await never.wait()

        async def send(message: Any) -> None:
            sent.append(message)
            if message["type"] == "http.response.body":
                await never.wait()  # the client stopped reading

        stream = EventStream(store=store, signals=Signals(), config=config, sid="s", after=0)
        await asyncio.wait_for(stream({"type": "http"}, receive, send), 5)
        assert len(sent) == 2  # headers, then one bounded chunk that was never taken
        assert sent[1]["body"].count(b"\nid: ") + 1 <= config.sse_batch


def test_sessions_and_kernels_on_bwrap(make_server: Callable[..., Server]) -> None:
    from tests.conftest import _require

    _require("bwrap")  # skips where bwrap cannot run, fails instead when CI requires it
    server = make_server(
        ScriptedModel([code("import os\nprint(os.getuid() >= 0)"), "ok"]), backend="bwrap"
    )
    sid = server.client.post("/sessions", json={"task": "t"}).json()["session_id"]
    assert (
        server.client.get(f"/sessions/{sid}/result", params={"timeout": 30}).json()["result"][
            "status"
        ]
        == "success"
    )
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    out = server.client.post(
        f"/kernels/{kid}/execute",
        json={"code": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)"},
    ).json()
    assert out["status"] == "error"  # no network inside bwrap


def test_bind_refuses_non_loopback_without_expose(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from sunroom.service import ServiceConfig

    with pytest.raises(ValidationError, match="expose"):
        ServiceConfig(host="0.0.0.0", token=TOKEN, db_path=tmp_path / "x.db")
    assert ServiceConfig(host="0.0.0.0", expose=True, token=TOKEN, db_path=tmp_path / "x.db").expose
    assert ServiceConfig(db_path=tmp_path / "x.db").host == "127.0.0.1"
    assert len(ServiceConfig(db_path=tmp_path / "x.db").with_token().token) >= 32
