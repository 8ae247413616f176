"""A restarted server takes its own sessions back at once (no 409, no wait for the lease)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.service.test_crash import ROOT, TOKEN, Service, read, wait_for
from tests.service.test_resume_messages import _env


def test_a_restarted_server_reclaims_its_sessions_at_once(tmp_path: Path) -> None:
    # the kill lands in the first model call (2 s): slack for a slow poll of the log
    env = _env(tmp_path, {"replies": ["done", "again"], "delay_s": 2.0})
    db = tmp_path / "s.db"
    service = Service(tmp_path, env, lease_s=60)  # the dead owner's lease outlives the test
    sid = service.client.post("/sessions", json={"task": "the task"}).json()["session_id"]
    wait_for(lambda: any(e.kind == "MessageReceived" for e in read(db, sid)[0]))
    service.kill()
    service = Service(tmp_path, env, lease_s=60)
    try:
        started = time.monotonic()
        r = service.client.post(f"/sessions/{sid}/messages", json={"text": "more"})
        assert r.status_code == 202, r.text
        wait_for(lambda: any(e.kind == "KernelRestarted" for e in read(db, sid)[0]), timeout=20)
        r = service.client.get(f"/sessions/{sid}/result", params={"timeout": 30})
        body = r.json()
    finally:
        service.stop()
    assert time.monotonic() - started < 30
    assert body["status"] == "finished" and body["result"]["status"] == "success", body
    kinds = [e.kind for e in read(db, sid)[0]]
    assert kinds.count("KernelRestarted") == 1 and kinds.count("MessageReceived") == 2, kinds


def test_serve_refuses_an_unknown_backend_at_start(tmp_path: Path) -> None:
    # already validated in sunroom/cli/serve.py (_check_service); this keeps it so
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0",
         "--db", str(tmp_path / "s.db"), "--backend", "nope"],
        cwd=ROOT, env={**os.environ, "SUNROOM_TOKEN": TOKEN}, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown backend 'nope'" in proc.stderr, proc.stderr
