"""``kill -9`` of the service mid-run at 10 points, then resume in a new process.

The service runs as ``sunroom serve`` in a subprocess with a side-effecting host function
(``charge``, which appends to a ledger file) and the scripted test model. After every kill a new
server resumes the session from the log. At the end: one run result, every call has exactly one
outcome, no charge happened twice, every charge has its call record, and the session said
(in its log and to the model) that the kernel restarted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sunroom.store import SQLiteStore, StoredEvent

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "crash-test-token-0123456789"
TURNS = 24


_started: list[Service] = []


@pytest.fixture(autouse=True)
def _no_leftover_services() -> Iterator[None]:
    """Stop every service a test started, even when the test fails half-way."""
    yield
    while _started:
        _started.pop().stop()


class Service:
    def __init__(self, tmp: Path, env: dict[str, str], *, lease_s: float = 1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0", "--db", str(tmp / "s.db"),
             "--backend", "subprocess", "--functions", "tests.service.hostfns:charge",
             "--lease-s", str(lease_s)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _started.append(self)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, line + (self.proc.stderr.read() if self.proc.stderr else "")
        self.url = line.rsplit(" ", 1)[-1].strip()
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.client.get("/healthz").json()["ok"]:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the service did not become healthy")

    def kill(self) -> None:
        self.client.close()
        if self in _started:
            _started.remove(self)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def stop(self) -> None:
        """SIGTERM, wait (then SIGKILL); idempotent."""
        if self.proc.poll() is not None:
            return
        if hasattr(self, "client"):
            self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def read(db: Path, sid: str) -> tuple[list[StoredEvent], list[Any]]:
    async def go() -> tuple[list[StoredEvent], list[Any]]:
        async with SQLiteStore(db) as store:
            return await store.events(sid), await store.calls(sid)

    return asyncio.run(go())


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_kill_9_at_ten_points_then_resume(tmp_path: Path) -> None:
    replies: list[Any] = [
        {"code": f"print(charge({i}))\nimport time\ntime.sleep(0.05)"} for i in range(TURNS)
    ]
    script = {"replies": [*replies, "all charged"], "delay_s": 0.1}
    (tmp_path / "script.json").write_text(json.dumps(script))
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "SUNROOM_TOKEN": TOKEN, "SUNROOM_MODEL": f"scripted:{tmp_path / 'script.json'}",
           "SUNROOM_TEST_LEDGER": str(ledger)}  # fmt: skip
    db = tmp_path / "s.db"
    service = Service(tmp_path, env)
    sid = service.client.post("/sessions", json={"task": "charge everything"}).json()["session_id"]
    # where to kill: once the log's last event is of this kind, plus a delay. Model calls take
    # 0.1 s, charge() 0.1 s after its side effect, the cell 0.05 s after charge() returns.
    points = [
        ("MessageReceived", 0.03),  # in the first model call
        ("HostCallStarted", 0.03),  # inside charge(): done, but its outcome not recorded
        ("HostCallFinished", 0.01),  # the cell still running after charge() returned
        ("TurnEnded", 0.05),  # in the next model call
        ("CodeSubmitted", 0.0),  # about to run the cell
        ("HostCallStarted", 0.0),  # charge() just started
        ("ExecutionFinished", 0.0),  # between the cell and the end of the turn
        ("UsageUpdated", 0.0),  # the reply is in; the cell not yet started
        ("KernelRestarted", 0.03),  # in the model call after a resume
        ("TurnEnded", 0.0),
    ]
    kills = 0
    seen = 0  # events before the current incarnation took over
    for kind, delay in points:

        def reached(kind: str = kind, seen: int = seen) -> bool:
            events = read(db, sid)[0]
            return len(events) > seen and any(e.kind == kind for e in events[seen:])

        wait_for(reached)
        time.sleep(delay)
        assert "SessionEnded" not in [e.kind for e in read(db, sid)[0]], "the run ended too soon"
        service.kill()
        kills += 1
        service = Service(tmp_path, env)
        # the new process resumes the session once the dead owner's lease runs out
        wait_for(lambda k=kills: sum(e.kind == "KernelRestarted" for e in read(db, sid)[0]) == k)
        events = read(db, sid)[0]
        seen = max(i for i, e in enumerate(events) if e.kind == "KernelRestarted")
    try:
        r = service.client.get(f"/sessions/{sid}/result", params={"timeout": 60})
        assert r.status_code == 200, r.text
        body = r.json()
    finally:
        service.stop()
    assert body["status"] == "finished" and body["result"]["status"] == "success", body

    events, calls = read(db, sid)
    kinds = [e.kind for e in events]
    assert kinds.count("KernelRestarted") == kills
    assert kinds.count("SessionEnded") == 1  # exactly one run result
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(c.outcome in ("ok", "unknown") for c in calls), [
        (c.call_id, c.outcome) for c in calls
    ]
    assert len({c.call_id for c in calls}) == len(calls)
    lines = [line.split() for line in ledger.read_text().splitlines()]
    keys = [k for k, _ in lines]
    amounts = [int(a) for _, a in lines]
    assert len(keys) == len(set(keys)), "a call's side effect happened twice"
    assert len(amounts) == len(set(amounts)), "a charge was repeated"
    by_key = {c.idempotency_key: c for c in calls}
    assert set(keys) <= set(by_key), "a side effect without a call record"
    for c in calls:
        if c.outcome == "ok":
            assert keys.count(c.idempotency_key) == 1
    unknown = [e for e in events if e.kind == "CallOutcomeUnknown"]
    assert len(unknown) == sum(c.outcome == "unknown" for c in calls)
    print("kills", kills, "calls", len(calls), "unknown", len(unknown), "ledger", len(keys))
    told = [
        e
        for e in events
        if e.kind == "Transcript" and "[The service restarted]" in json.dumps(e.payload)
    ]
    assert told, "the model was never told that the kernel restarted"


def test_cli_resumes_a_session_a_killed_service_left_running(tmp_path: Path) -> None:
    replies = [{"code": f"print(charge({i}))"} for i in range(6)]
    (tmp_path / "script.json").write_text(
        json.dumps({"replies": [*replies, "done"], "delay_s": 0.2})
    )
    env = {**os.environ, "SUNROOM_TOKEN": TOKEN, "SUNROOM_MODEL": f"scripted:{tmp_path / 'script.json'}",
           "SUNROOM_TEST_LEDGER": str(tmp_path / "ledger.txt"), "SUNROOM_DB": str(tmp_path / "s.db"),
           "SUNROOM_FUNCTIONS": "tests.service.hostfns:charge",
           # charge(1) on waits for the gate: the service is killed with the run in progress
           "SUNROOM_TEST_HOLD_FROM": "1", "SUNROOM_TEST_GATE": str(tmp_path / "go")}  # fmt: skip
    service = Service(tmp_path, env)
    sid = service.client.post("/sessions", json={"task": "charge"}).json()["session_id"]
    wait_for(lambda: any(e.kind == "HostCallFinished" for e in read(tmp_path / "s.db", sid)[0]))
    service.kill()
    time.sleep(1.2)  # the dead server's lease (1 s) runs out
    (tmp_path / "go").touch()
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "sessions", "resume", sid, "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "success" and out["output"] == "done" and out["session_id"] == sid
    events, calls = read(tmp_path / "s.db", sid)
    assert [e.kind for e in events].count("KernelRestarted") == 1
    assert all(c.outcome in ("ok", "unknown") for c in calls)
