"""``sunroom run``, ``serve`` and ``sessions``, as subprocesses, with the scripted-model test hook."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    script = {
        "replies": [
            {
                "text": "Counting.",
                "code": "print(len(doc))\nprint(predict_many('size?', ['a', 'b', 'c']))",
            },
            {"code": "submit({'n': len(doc)})"},
        ],
        "sub_reply": "small",
    }
    (tmp_path / "script.json").write_text(json.dumps(script))
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SUNROOM_MODEL", "SUNROOM_BASE_URL", "SUNROOM_TOKEN")
    }
    out.update(
        SUNROOM_FAKE_MODEL=str(tmp_path / "script.json"),
        SUNROOM_DB=str(tmp_path / "s.db"),
        COLUMNS="100",
    )
    return out


def run_args(tmp_path: Path) -> list[str]:
    (tmp_path / "doc.txt").write_text("hello world")
    (tmp_path / "schema.json").write_text(
        json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    )
    return ["run", "How long is doc?", "--input", f"doc={tmp_path / 'doc.txt'}", "--output-schema",
            str(tmp_path / "schema.json"), "--backend", "subprocess", "--preset", "rlm"]  # fmt: skip


def test_run_json_prints_one_object(tmp_path: Path, env: dict[str, str]) -> None:
    proc = cli(*run_args(tmp_path), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    assert set(out) == {"status", "output", "usage", "cost_micro_usd", "session_id"}
    assert out["status"] == "success" and out["output"] == {"n": 11}
    assert out["usage"]["input_tokens"] > 0

    listing = json.loads(cli("sessions", "list", "--json", env=env).stdout)
    assert [s["session_id"] for s in listing] == [out["session_id"]]
    assert listing[0]["status"] == "finished"
    shown = json.loads(cli("sessions", "show", out["session_id"], "--json", env=env).stdout)
    kinds = [e["type"] for e in shown["events"]]
    assert (
        kinds[0] == "MessageReceived" and "PredictProgress" in kinds and kinds[-1] == "SessionEnded"
    )
    text = cli("sessions", "show", out["session_id"], env=env)
    assert text.returncode == 0 and "submit" in text.stdout

    assert json.loads(cli("sessions", "purge", "--older-than", "1d", "--json", env=env).stdout) == {
        "purged": 0
    }
    assert json.loads(cli("sessions", "purge", "--older-than", "0", "--json", env=env).stdout) == {
        "purged": 1
    }
    assert json.loads(cli("sessions", "list", "--json", env=env).stdout) == []


def test_run_renders_cells_progress_and_cost(tmp_path: Path, env: dict[str, str]) -> None:
    proc = cli(*run_args(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "› How long is doc?" in out
    assert "print(len(doc))" in out and "cell · turn 1" in out
    assert "predict_many" in out and "3/3" in out
    assert "calls ·" in out and " in / " in out and "cost unknown" in out
    assert "success" in out and "{'n': 11}" in out


def test_run_failures_exit_1_and_usage_errors_exit_2(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "bad.json").write_text(json.dumps(["I will not submit."]))
    bad = {**env, "SUNROOM_FAKE_MODEL": str(tmp_path / "bad.json")}
    proc = cli(
        "run",
        "x",
        "--preset",
        "rlm",
        "--backend",
        "subprocess",
        "--max-turns",
        "2",
        "--json",
        env=bad,
    )
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["status"] == "max_turns"
    no_model = {k: v for k, v in env.items() if k != "SUNROOM_FAKE_MODEL"}
    proc = cli("run", "x", env=no_model)
    assert proc.returncode == 2 and "no model" in proc.stderr
    assert cli("run", "x", "--input", "not-a-pair", env=env).returncode == 2
    assert cli("sessions", "show", "nope", env=env).returncode == 2


def test_serve_prints_url_and_token_and_refuses_to_expose(
    tmp_path: Path, env: dict[str, str]
) -> None:
    proc = cli("serve", "--host", "0.0.0.0", "--port", "0", env=env)
    assert proc.returncode == 2 and "expose" in proc.stderr
    server = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0", "--backend", "subprocess"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().rsplit(" ", 1)[-1].strip()
        token = server.stdout.readline().split("token: ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and len(token) >= 32
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(200):
                try:
                    client.get("/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            assert client.get("/healthz").status_code == 200
            assert client.get("/sessions").status_code == 401
            headers = {"Authorization": f"Bearer {token}"}
            sid = client.post("/sessions", json={"task": "t", "inputs": {"doc": "abc"}, "preset": "rlm"},
                              headers=headers).json()["session_id"]  # fmt: skip
            r = client.get(f"/sessions/{sid}/result", params={"timeout": 30}, headers=headers)
            assert r.json()["result"]["output"] == {"n": 3}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(20)
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()
    assert server.returncode in (
        0,
        -signal.SIGTERM,
    )  # uvicorn re-raises the signal after a clean shutdown
