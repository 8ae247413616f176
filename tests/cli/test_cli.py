from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
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
    for option in ("--timeout", "--memory-mb"):
        proc = run("exec", "--backend", "subprocess", option, "0", "-", stdin="1")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert option in proc.stderr and "Limits" not in proc.stderr


def test_exec_refuses_a_file_that_is_not_utf8_text(tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"print(1)\n\xd0\xff\x00\x81 binary")
    for path in (str(blob), "/bin/ls"):
        proc = run("exec", "--backend", "subprocess", path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("sunroom: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "UTF-8" in proc.stderr and path in proc.stderr
    piped = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "exec", "--backend", "subprocess", "-"],
        input=b"\xff\xfe\x00", capture_output=True, timeout=60,
    )  # fmt: skip
    assert piped.returncode == 2 and piped.stderr.count(b"\n") == 1, piped.stderr
    assert b"UTF-8" in piped.stderr


def test_exec_timeout_says_timed_out_instead_of_a_traceback() -> None:
    code = "print('started', flush=True)\nimport time\ntime.sleep(30)"
    proc = run("exec", "--backend", "subprocess", "--timeout", "1", "-", stdin=code)
    assert proc.returncode == 124
    assert proc.stdout == "started\n"
    assert proc.stderr == "sunroom: timed out after 1 s\n"


def test_exec_timeout_of_a_cell_that_ignores_sigint_restarts_no_kernel() -> None:
    """The kernel is killed and not restarted: a one-shot exec has no next cell."""
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "exec", "--backend", "subprocess", "--timeout",
         "0.5", "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(code)
    proc.stdin.close()
    cli = psutil.Process(proc.pid)
    kernels: set[int] = set()
    deadline = time.monotonic() + 60
    while proc.poll() is None:  # watch every kernel the command starts until it exits
        assert time.monotonic() < deadline, "exec did not end"
        with contextlib.suppress(psutil.Error):
            for child in cli.children():
                with contextlib.suppress(psutil.Error):
                    line = " ".join(child.cmdline())
                    if "sunroom.prelude.supervisor" in line or "sunroom-watch" in line:
                        kernels.add(child.pid)
        time.sleep(0.005)
    assert proc.stderr is not None and proc.stdout is not None
    err = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()
    assert proc.returncode == 124, err
    assert len(kernels) == 1, f"{len(kernels)} kernels were started"
    assert err.startswith("sunroom: timed out after 0.5 s") and err.count("\n") == 1, err


def test_exec_input_binds_files_read_only() -> None:
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="sunroom-test-cli-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        (folder / "a.txt").write_text("alpha")
        (folder / "b.txt").write_text("beta")
        for f in folder.iterdir():
            f.chmod(0o644)
        code = "type(a).__name__, a.read_text(), b.read_text()"
        proc = run(
            "exec", "--backend", "subprocess", "--input", f"a={folder / 'a.txt'}",
            "--input", f"b={folder / 'b.txt'}", "-", stdin=code,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "('PosixPath', 'alpha', 'beta')\n"
        for bad in ("noequals", f"1x={folder / 'a.txt'}", f"x={folder / 'missing.txt'}"):
            proc = run("exec", "--backend", "subprocess", "--input", bad, "-", stdin="1")
            assert proc.returncode == 2, proc.stderr
            assert proc.stderr.startswith("sunroom: ") and proc.stderr.count("\n") == 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


WRITER = """
import os
os.makedirs('out/deep', exist_ok=True)
open('out/deep/r.csv', 'w').write('a,b\\n')
open('report.txt', 'w').write('done')
open('skip.log', 'w').write('noise')
os.symlink('/etc/passwd', 'leak')
print('wrote')
"""


def test_exec_output_copies_the_files_the_code_wrote(tmp_path: Path) -> None:
    dest = tmp_path / "results"
    proc = run("exec", "--backend", "subprocess", "--output", str(dest), "-", stdin=WRITER)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "wrote\n"
    assert "skipped 'leak'" in proc.stderr  # a link out of the workdir is never followed
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "out/deep/r.csv",
        "report.txt",
        "skip.log",
    ]
    assert (dest / "out/deep/r.csv").read_text() == "a,b\n"
    assert not (dest / "leak").exists()


def test_exec_output_glob_picks_files(tmp_path: Path) -> None:
    dest = tmp_path / "results"
    proc = run(
        "exec", "--backend", "subprocess", "--output", str(dest),
        "--output-glob", "**/*.csv", "--output-glob", "*.txt", "-", stdin=WRITER,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "out/deep/r.csv",
        "report.txt",
    ]
    proc = run("exec", "--backend", "subprocess", "--output-glob", "*.txt", "-", stdin="1")
    assert proc.returncode == 2 and "--output-glob needs --output" in proc.stderr


def test_exec_output_has_a_total_cap(tmp_path: Path) -> None:
    """Issue 26: ``--output-max-mb`` (default 1024) caps what ``--output`` writes in all."""
    dest = tmp_path / "results"
    two_mb = (
        "open('a.bin', 'wb').write(b'a' * (1 << 20))\nopen('b.bin', 'wb').write(b'b' * (1 << 20))"
    )
    proc = run(
        "exec", "--backend", "subprocess", "--output", str(dest), "--output-max-mb", "1", "-",
        stdin=two_mb,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "sunroom: the files to copy hold 2097152 bytes, over the limit of 1048576; "
        "nothing was copied\n"
    )
    assert list(dest.iterdir()) == []
    proc = run(
        "exec", "--backend", "subprocess", "--output", str(dest), "--output-max-mb", "2", "-",
        stdin=two_mb,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["a.bin", "b.bin"]
    proc = run("exec", "--output", str(dest), "--output-max-mb", "0", "-", stdin="1")
    assert proc.returncode == 2 and "--output-max-mb must be a positive" in proc.stderr
    help_text = run("exec", "--help").stdout
    assert "--output-max-mb" in help_text and "1024" in help_text


def test_version_and_short_help() -> None:
    from importlib.metadata import version

    from sunroom import __version__

    shown = run("--version")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"sunroom {__version__}\n"
    assert __version__ == version("sunroom")  # the one in pyproject.toml
    for args in (("-h",), ("run", "-h"), ("sessions", "-h")):
        helped = run(*args)
        assert helped.returncode == 0, (args, helped.stderr)
        assert "Usage:" in helped.stdout and "--help" in helped.stdout, args
