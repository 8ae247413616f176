from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [
        ("print('hi')\n1 + 1", "ok", 0),
        ("raise ValueError('bad')", "error", 1),
        ("import time\ntime.sleep(30)", "timeout", 124),
        ("import os\nos._exit(9)", "died", 125),
    ],
)
def test_exec_exit_codes_and_json(code: str, status: str, exit_code: int) -> None:
    proc = run("exec", "--backend", "subprocess", "--timeout", "1", "--json", "-", stdin=code)
    assert proc.returncode == exit_code, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == status


def test_exec_file_prints_output(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('out')\nprint('err', file=sys.stderr)\n'val'")
    proc = run("exec", "--backend", "subprocess", str(script))
    assert proc.returncode == 0
    assert proc.stdout == "out\n'val'\n"
    assert proc.stderr == "err\n"
    proc = run("exec", "--backend", "subprocess", "-", stdin="1/0")
    assert proc.returncode == 1
    assert "ZeroDivisionError" in proc.stderr


def test_exec_reports_setup_errors() -> None:
    proc = run("exec", "--backend", "nonsense", "-", stdin="1")
    assert proc.returncode == 2
    assert "unknown backend" in proc.stderr
    proc = run("exec", "/no/such/file.py")
    assert proc.returncode == 2
