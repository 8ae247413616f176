"""``sunroom run``, ``serve`` and ``sessions``, as subprocesses, with ``scripted:`` models."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sunroom.store import SQLiteStore
from tests.providers.replay import ReplayServer, reply_from
from tests.service.terminal import iterm_images, kitty_images


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
                "code": "text = doc if isinstance(doc, str) else doc.read_text()\n"
                "print(len(text))\nprint(predict_many('size?', ['a', 'b', 'c']))",
            },
            {"code": "submit({'n': len(text)})"},
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
        SUNROOM_MODEL=f"scripted:{tmp_path / 'script.json'}",
        SUNROOM_DB=str(tmp_path / "s.db"),
        COLUMNS="100",
    )
    return out


@pytest.fixture
def readable_dir() -> Iterator[Path]:
    """A folder kernels can read when tests run as root (they run as an unprivileged uid)."""
    folder = Path(tempfile.mkdtemp(prefix="sunroom-test-run-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run_args(tmp_path: Path, readable_dir: Path) -> list[str]:
    (readable_dir / "doc.txt").write_text("hello world")
    (readable_dir / "doc.txt").chmod(0o644)
    (tmp_path / "schema.json").write_text(
        json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    )
    return ["run", "How long is doc?", "--input", f"doc={readable_dir / 'doc.txt'}", "--output-schema",
            str(tmp_path / "schema.json"), "--backend", "subprocess", "--preset", "rlm"]  # fmt: skip


def test_run_json_prints_one_object(
    tmp_path: Path, env: dict[str, str], readable_dir: Path
) -> None:
    proc = cli(*run_args(tmp_path, readable_dir), "--json", env=env)
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


def test_run_renders_cells_progress_and_cost(
    tmp_path: Path, env: dict[str, str], readable_dir: Path
) -> None:
    proc = cli(*run_args(tmp_path, readable_dir), env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "› How long is doc?" in out
    assert "print(len(text))" in out and "cell · turn 1" in out
    assert "predict_many" in out and "3/3" in out
    assert "calls ·" in out and " in / " in out and "cost unknown" in out
    assert "success" in out and "{'n': 11}" in out


def test_run_base_url_reaches_a_local_model_server(tmp_path: Path, env: dict[str, str]) -> None:
    """``--base-url`` is the operator's own choice, like SUNROOM_BASE_URL: the service's
    allowlist for remote clients does not apply to it (it refused this no-key, local-model
    user's command: "base_url is not one this server allows")."""
    env = {k: v for k, v in env.items() if k not in ("SUNROOM_MODEL", "OPENAI_API_KEY")}
    with ReplayServer() as server:  # a recorded OpenAI chat reply (tests/providers/data)
        server.add("/v1/chat/completions", reply_from("openai/chat_text"), times=None)
        proc = cli(
            "run", "What is the weather in SF?", "--model", "openai-compatible:gpt-4o-2024-08-06",
            "--base-url", f"{server.url}/v1", "--backend", "subprocess", "--json", env=env,
        )  # fmt: skip
        paths = [r.path for r in server.requests]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "success", out
    assert "weather" in out["output"]
    assert paths and set(paths) == {"/v1/chat/completions"}


def test_run_failures_exit_1_and_usage_errors_exit_2(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "bad.json").write_text(json.dumps(["I will not submit."]))
    bad = {**env, "SUNROOM_MODEL": f"scripted:{tmp_path / 'bad.json'}"}
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
    no_model = {k: v for k, v in env.items() if k != "SUNROOM_MODEL"}
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


INTERNALS = re.compile(
    r"Traceback|ValidationError|validation error|ServiceConfig|CreateSession|pydantic|"
    r"input_value|errors\.pydantic\.dev|\[type="
)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The usage error *proc* printed: exit 2, one ``sunroom: ...`` line, no internals."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("sunroom: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert not INTERNALS.search(proc.stderr + proc.stdout), proc.stderr
    return proc.stderr


def test_config_errors_are_one_line_and_never_echo_the_token(
    tmp_path: Path, env: dict[str, str]
) -> None:
    short = {**env, "SUNROOM_TOKEN": "hunter2"}
    for args in (("serve", "--port", "0"), ("sessions", "list")):
        proc = cli(*args, env=short)
        err = one_line_error(proc)
        assert "hunter2" not in proc.stdout + err and "SUNROOM_TOKEN" in err
    secret = "a-long-and-secret-token-0123456789"
    proc = cli("serve", "--host", "0.0.0.0", "--port", "0", env={**env, "SUNROOM_TOKEN": secret})
    err = one_line_error(proc)
    assert "--expose" in err and secret not in proc.stdout + err
    err = one_line_error(cli("serve", "--port", "0", "--lease-s", "-1", env=env))
    assert "lease" in err
    err = one_line_error(cli("serve", "--port", "0", "--template", "no-equals-sign", env=env))
    assert "NAME=FILE" in err
    missing = str(tmp_path / "missing.py")
    err = one_line_error(cli("serve", "--port", "0", "--template", f"warm={missing}", env=env))
    assert "cannot read template 'warm'" in err and missing in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        err = one_line_error(cli("serve", "--port", port, env=env))
    assert "address already in use" in err.lower() and port in err


def test_option_errors_are_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    err = one_line_error(cli("run", "x", "--preset", "nope", env=env))
    assert "--preset" in err and "codeact" in err and "'nope'" in err
    err = one_line_error(cli("run", "x", "--max-turns", "0", env=env))
    assert "--max-turns" in err
    (tmp_path / "bad-schema.json").write_text('{"type": "frobnicate"}')
    err = one_line_error(
        cli("run", "x", "--output-schema", str(tmp_path / "bad-schema.json"), env=env)
    )
    assert "frobnicate" in err
    err = one_line_error(cli("run", "x", "--backend", "nonsense", env=env))
    assert "backend" in err
    err = one_line_error(cli("run", "x", "--input", f"doc={tmp_path / 'missing.txt'}", env=env))
    assert "--input doc" in err and "missing.txt" in err
    err = one_line_error(cli("serve", "--port", "0", "--model", "nope:x", env=env))
    assert "unknown provider" in err
    no_key = {k: v for k, v in env.items() if k != "ANTHROPIC_API_KEY"}
    err = one_line_error(
        cli("serve", "--port", "0", "--model", "anthropic:claude-haiku-4-5", env=no_key)
    )
    assert "no API key" in err and "ANTHROPIC_API_KEY" in err
    err = one_line_error(cli("serve", "--port", "0", "--functions", "no_such_module:f", env=env))
    assert "no_such_module" in err
    assert json.loads(cli("sessions", "list", "--json", env=env).stdout) == []


def test_usage_errors_record_no_session(tmp_path: Path, env: dict[str, str]) -> None:
    no_key = {k: v for k, v in env.items() if k != "OPENAI_API_KEY"}
    for args, words in [
        (("--model", "nope:x"), ["unknown provider"]),
        (("--model", "gpt-5"), ["<provider>:<model>", "openai:"]),
        (("--model", "openai:gpt-5-mini"), ["OPENAI_API_KEY"]),
        (("--model", f"scripted:{tmp_path / 'missing.json'}"), ["cannot read", "missing.json"]),
    ]:
        err = one_line_error(cli("run", "x", "--backend", "subprocess", *args, env=no_key))
        assert all(w in err for w in words), err
    err = one_line_error(
        cli("run", "x", env={k: v for k, v in env.items() if k != "SUNROOM_MODEL"})
    )
    assert "no model" in err and "--model" in err
    assert json.loads(cli("sessions", "list", "--json", env=env).stdout) == []


def stored_sessions(db: Path) -> list[Any]:
    async def go() -> list[Any]:
        async with SQLiteStore(db) as store:
            return await store.list_sessions(limit=10)

    return asyncio.run(go())


def stored_events(db: Path) -> list[Any]:
    async def go() -> list[Any]:
        async with SQLiteStore(db) as store:
            sessions = await store.list_sessions(limit=1)
            return await store.events(sessions[0].session_id) if sessions else []

    return asyncio.run(go())


def interrupt_once_running(args: list[str], env: dict[str, str], db: Path, after: int) -> str:
    """Run ``sunroom ARGS``, Ctrl-C it once the log grew past *after* events; its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (db.exists() and len(stored_events(db)) > after):  # the run is in progress
        assert time.monotonic() < deadline and proc.poll() is None, "no run started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    return err


def test_ctrl_c_says_which_session_and_how_to_resume_it(
    tmp_path: Path, env: dict[str, str], readable_dir: Path
) -> None:
    # Every step waits in its cell for a gate the test opens only at the end, so each Ctrl-C
    # lands while the run is in progress however slowly the machine runs the test.
    gate = readable_dir / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.02)\n"
    replies = [{"code": f"{wait}print('step {i}')"} for i in range(4)]
    (tmp_path / "slow.json").write_text(json.dumps({"replies": [*replies, "done"]}))
    slow = {**env, "SUNROOM_MODEL": f"scripted:{tmp_path / 'slow.json'}"}
    db = Path(env["SUNROOM_DB"])
    err = interrupt_once_running(["run", "count", "--backend", "subprocess"], slow, db, 0)
    (record,) = stored_sessions(db)
    sid = record.session_id
    assert record.status == "running"
    assert err.count("\n") == 1 and sid in err and "Traceback" not in err, err
    command = err.split("resume it with: ", 1)[1].split()
    assert command == ["sunroom", "sessions", "resume", sid]
    # a resume interrupted in turn says the same
    err = interrupt_once_running(command[1:], slow, db, len(stored_events(db)) + 1)
    assert err.split("resume it with: ", 1)[1].split() == command
    gate.touch()
    resumed = cli(*command[1:], "--json", env=slow)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["output"] == "done"


def test_run_code_mode_fenced_for_models_without_tool_calling(
    tmp_path: Path, env: dict[str, str], readable_dir: Path
) -> None:
    script = [
        {"text": "Counting.", "code": "print(len(doc.read_text()))"},
        {"code": "submit({'n': len(doc.read_text())})"},
    ]
    (tmp_path / "fenced.json").write_text(json.dumps(script))
    fenced = {**env, "SUNROOM_MODEL": f"scripted:{tmp_path / 'fenced.json'}"}
    proc = cli(*run_args(tmp_path, readable_dir), "--code-mode", "fenced", "--json", env=fenced)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["output"] == {"n": 11}
    shown = json.loads(cli("sessions", "show", out["session_id"], "--json", env=env).stdout)
    assert [e["via"] for e in shown["events"] if e["type"] == "CodeSubmitted"] == ["fenced"] * 2
    err = one_line_error(cli("run", "x", "--code-mode", "telepathy", env=env))
    assert "--code-mode" in err and "fenced" in err


def test_run_saves_the_images_the_code_displays(tmp_path: Path, env: dict[str, str]) -> None:
    script = {
        "replies": [
            {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nprint('drawn')"},
            "A line that rises, then falls.",
        ]
    }
    (tmp_path / "plot.json").write_text(json.dumps(script))
    plot_env = {**env, "SUNROOM_MODEL": f"scripted:{tmp_path / 'plot.json'}"}
    for k in ("TTY_COMPATIBLE", "FORCE_COLOR", "TMUX", "STY"):
        plot_env.pop(k, None)
    tty = {**plot_env, "TTY_COMPATIBLE": "1"}  # rich takes stdout for a terminal
    folder = tmp_path / "images"
    args = ["run", "plot it", "--backend", "subprocess"]
    proc = cli(*args, "--images", str(folder), "--inline-images", "kitty", env=tty)
    assert proc.returncode == 0, proc.stderr
    saved = sorted(folder.iterdir())
    assert [p.name for p in saved] == ["image-001.png"]
    assert saved[0].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert kitty_images(proc.stdout) == [saved[0].read_bytes()]  # saved and shown
    assert str(saved[0]) in re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout).replace("\n", "")
    without = cli(*args, "--inline-images", "kitty", env=plot_env)  # stdout is a pipe
    assert "image/png" in without.stdout and "--images DIR saves it" in without.stdout
    assert "\x1b" not in without.stdout
    sid = json.loads(cli("sessions", "list", "--json", env=plot_env).stdout)[0]["session_id"]
    shown = cli("sessions", "show", sid, "--inline-images", "iterm", env=tty)
    assert len(iterm_images(shown.stdout)) == 1
    auto = cli("sessions", "show", sid, env={**tty, "TERM": "xterm-kitty", "TMUX": "/t,1,0"})
    assert "image/png" in auto.stdout and "\x1b_G" not in auto.stdout  # off inside tmux
    err = one_line_error(cli(*args, "--inline-images", "sixel", env=plot_env))
    assert "--inline-images must be one of auto, kitty, iterm, off, got 'sixel'" in err


def test_run_input_binds_the_file_and_a_resume_binds_it_again_or_refuses(
    tmp_path: Path, env: dict[str, str], readable_dir: Path
) -> None:
    data = readable_dir / "data.csv"
    data.write_text("region,revenue\nnorth,3\nsouth,5\n")
    data.chmod(0o644)
    script = {
        "replies": [
            {"code": "print(type(doc).__name__, doc.read_text().count('\\n'))"},
            "Three lines.",
            {"code": "print(doc.read_text().splitlines()[-1])"},
            "Still there.",
        ]
    }
    (tmp_path / "files.json").write_text(json.dumps(script))
    files_env = {**env, "SUNROOM_MODEL": f"scripted:{tmp_path / 'files.json'}"}
    proc = cli("run", "Count the lines", "--input", f"doc={data}", "--backend", "subprocess",
               "--json", env=files_env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sid = json.loads(proc.stdout)["session_id"]
    shown = json.loads(cli("sessions", "show", sid, "--json", env=env).stdout)
    outputs = [e["output"] for e in shown["events"] if e["type"] == "ExecutionFinished"]
    assert "Path 3" in outputs[0], outputs  # a pathlib.Path (PosixPath), not the text
    (record,) = stored_sessions(Path(env["SUNROOM_DB"]))
    info = data.stat()
    # the stored session names the file (resolved), its size and mtime: never its content
    assert record.config["files"] == {
        "doc": {"path": str(data.resolve()), "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    }
    assert "north" not in json.dumps(record.config)
    # resumed in a new process: the same file is bound again
    resumed = cli("sessions", "resume", sid, "--message", "Last line?", "--json", env=files_env)
    assert resumed.returncode == 0, resumed.stderr
    shown = json.loads(cli("sessions", "show", sid, "--json", env=env).stdout)
    outputs = [e["output"] for e in shown["events"] if e["type"] == "ExecutionFinished"]
    assert "south,5" in outputs[-1], outputs
    # changed, then gone: the resume refuses in one sentence
    data.write_text("region,revenue\nnorth,4\n")
    err = one_line_error(cli("sessions", "resume", sid, "--message", "x", env=files_env))
    assert "'doc'" in err and "changed since the session started" in err, err
    data.unlink()
    err = one_line_error(cli("sessions", "resume", sid, "--message", "x", env=files_env))
    assert "'doc'" in err and "is gone" in err, err


def test_run_shows_a_cells_output_as_it_comes_then_its_result_and_the_answer(
    tmp_path: Path, env: dict[str, str], readable_dir: Path
) -> None:
    flag = readable_dir / "go-on"  # the kernel runs as another uid
    cell = (
        "import pathlib, sys, time\n"
        "print('line 1', flush=True)\n"
        "print('warning 1', file=sys.stderr, flush=True)\n"
        f"flag = pathlib.Path({str(flag)!r})\n"
        "for _ in range(12_000):  # the test creates it once it saw line 1\n"
        "    if flag.exists():\n"
        "        break\n"
        "    time.sleep(0.01)\n"
        "print('line 2:', 'released' if flag.exists() else 'never released')\n"
        "1 / 0\n"
    )
    script = {"replies": [{"code": cell, "text": ""}, "The answer is 42."]}
    (tmp_path / "live.json").write_text(json.dumps(script))
    env = {**env, "SUNROOM_MODEL": f"scripted:{tmp_path / 'live.json'}"}
    seen: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "run", "go", "--backend", "subprocess"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            for line in proc.stdout:  # stdout is a pipe: plain lines, no redraws
                seen.append(line.rstrip("\n"))
                if line.strip() == "line 1":
                    assert not any(s.startswith("error ·") for s in seen)  # the cell still runs
                    flag.touch()
            proc.wait(60)
        finally:
            proc.kill()
        assert proc.returncode == 0, proc.stderr.read()
    assert flag.exists()

    def at(text: str) -> int:
        return next(i for i, s in enumerate(seen) if s.strip() == text)

    ended = next((i for i, s in enumerate(seen) if s.startswith("error ·")), None)
    assert ended is not None, "\n".join(seen)
    # stdout and stderr are separate pipes: their lines keep each stream's order, not the
    # order between the two (stderr came first once under CI load)
    assert at("line 1") < at("line 2: released") < ended
    assert at("warning 1") < at("line 2: released")
    assert at("ZeroDivisionError: division by zero") > ended  # the rest of what the model saw
    assert at("The answer is 42.") > ended
    assert sum(s.strip() == "line 1" for s in seen) == 1  # not printed again at the end
    assert not any("\x1b[" in s for s in seen)  # no live redraws on a pipe


def test_a_plain_text_answer_is_printed_once(tmp_path: Path, env: dict[str, str]) -> None:
    """The codeact preset's answer is the model's last reply, already shown as it came: the
    end of the run says success without printing it a second time."""
    replies = Path(__file__).resolve().parents[2] / "examples" / "replies.json"
    env = {**env, "SUNROOM_MODEL": f"scripted:{replies}"}
    proc = cli("run", "What is the 20th Fibonacci number?", "--backend", "subprocess", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("The 20th Fibonacci number is 6765.") == 1, proc.stdout
    assert "success" in proc.stdout.rsplit("6765.", 1)[1]
