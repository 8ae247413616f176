"""How ``sunroom exec`` reports what goes wrong, as a user running the command sees it.

Before (issue 28, item 6): a 200 MB file was "KernelDied: the kernel broke the protocol (cannot
send 'execute': frame of ... bytes exceeds the ...-byte cap) and was killed; it was restarted"
with exit 125; a kernel that died or ran out of memory was reported without the ``sunroom:``
prefix and said "it was restarted" although exec had ended; Ctrl-C printed "Task exception was
never retrieved" and a traceback after the exit message.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sunroom.sandbox.limits import Limits


def _exec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "exec", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_file_over_the_frame_limit_is_a_usage_error_naming_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.py"
    with big.open("w") as f:  # 20 MiB: over the 16 MiB frame a cell is sent in
        f.write("x = 1\n#" + "a" * (20 << 20) + "\nprint(x)\n")
    proc = _exec(str(big))
    assert proc.returncode == 2, proc.stderr
    limit = Limits().max_code_bytes
    assert proc.stderr == (
        f"sunroom: {big} is over {limit:,} bytes, the most one cell's source may be (a cell is "
        f"sent in one protocol frame of at most {Limits().max_frame_bytes:,} bytes)\n"
    )
    assert proc.stdout == ""


def test_a_file_just_under_the_limit_runs(tmp_path: Path) -> None:
    edge = tmp_path / "edge.py"
    edge.write_text("#" + "a" * (Limits().max_code_bytes - 20) + "\nprint('ran')\n")
    proc = _exec("--backend", "subprocess", str(edge))
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc.stderr


def test_a_kernel_that_dies_is_one_sunroom_line_that_says_no_restart(tmp_path: Path) -> None:
    """Four at once: the burst in which asyncio's child watcher once lost supervisors' exit
    statuses ("Unknown child process pid N, will report returncode 255" on stderr)."""
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda _: _exec(str(script)), range(4)))
    for proc in procs:
        assert proc.returncode == 125, proc.stderr
        assert proc.stderr == "sunroom: the kernel was killed by SIGKILL (possibly out of memory)\n"


def test_out_of_memory_is_one_sunroom_line(tmp_path: Path) -> None:
    script = tmp_path / "oom.py"
    script.write_text(
        "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n"
        "    chunks[-1][::4096] = b'x' * len(range(0, 64 << 20, 4096))\n"
    )
    proc = _exec("--memory-mb", "256", str(script))  # bwrap: a cgroup counts the OOM kill
    assert proc.returncode == 125, proc.stderr
    assert proc.stderr == "sunroom: the kernel ran out of memory (limit 256 MB) and was killed\n"


def test_ctrl_c_mid_cell_exits_130_without_a_stray_traceback(tmp_path: Path) -> None:
    shared = Path(tempfile.mkdtemp(prefix="sunroom-test-exec-", dir="/tmp"))
    shared.chmod(0o777)  # the kernel runs as an unprivileged uid when tests run as root
    started = shared / "started"
    script = tmp_path / "wait.py"
    script.write_text(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\n"
    )
    try:
        _interrupt_mid_cell(script, started)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _interrupt_mid_cell(script: Path, started: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "exec", "--backend", "subprocess", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "never retrieved" not in err, err


def test_syntax_errors_and_tracebacks_name_the_file_given(tmp_path: Path) -> None:
    """Before, they said ``File "<cell-1>"`` whatever file exec ran (issue 28, item 9)."""
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\ny = (\n")
    proc = _exec("--backend", "subprocess", str(broken))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f'  File "{broken}", line 2\n'), proc.stderr
    assert proc.stderr.endswith("SyntaxError: '(' was never closed\n"), proc.stderr
    failing = tmp_path / "failing.py"
    failing.write_text("def f():\n    return 1 / 0\n\nf()\n")
    proc = _exec("--backend", "subprocess", str(failing))
    assert proc.returncode == 1
    assert f'File "{failing}", line 4, in <module>' in proc.stderr, proc.stderr
    assert f'File "{failing}", line 2, in f\n    return 1 / 0' in proc.stderr, proc.stderr
    assert proc.stderr.startswith("Traceback (most recent call last):\n  File"), proc.stderr
    piped = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "exec", "--backend", "subprocess", "-"],
        input="1 +\n", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert piped.stderr.startswith('  File "<stdin>", line 1\n'), piped.stderr
