"""SIGTERM while raw kernels run cells (issue 26, item 3).

A real ``sunroom serve`` in a subprocess (subprocess backend), a client whose execute is in a
long cell when the server gets SIGTERM: the client gets a clear 503, the kernel is closed, the
server logs no traceback and exits 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.service.conftest import TOKEN

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def _serve(tmp_path: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """A real ``sunroom serve`` (subprocess backend) with *extra* arguments; killed after."""
    env = {**os.environ, "SUNROOM_TOKEN": TOKEN}
    env.pop("SUNROOM_MODEL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0",
         "--db", str(tmp_path / "s.db"), "--backend", "subprocess", *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    with _serve(tmp_path) as proc:
        yield proc


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_sigterm_during_executes_answers_503_closes_the_kernels_and_logs_no_traceback(
    service: subprocess.Popen[str],
) -> None:
    assert service.stdout is not None and service.stderr is not None
    line = service.stdout.readline()
    assert "listening on" in line, line
    url = line.rsplit(" ", 1)[-1].strip()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answers: list[httpx.Response | BaseException] = []
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.get("/healthz").json()["ok"]:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
        kids = [client.post("/kernels", json={}).json()["kernel_id"] for _ in range(2)]
        kernel_pids = [p.pid for p in _descendants(service.pid)]
        assert kernel_pids

        def run(kid: str) -> None:
            body = {"code": "import time\ntime.sleep(60)", "timeout_s": 120}
            try:
                answers.append(client.post(f"/kernels/{kid}/execute", json=body))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                answers.append(exc)

        threads = [threading.Thread(target=run, args=(kid,)) for kid in kids]
        for t in threads:
            t.start()
        time.sleep(1.0)  # both cells are running
        start = time.monotonic()
        service.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(20)
        code = service.wait(20)
        took = time.monotonic() - start
    stderr = service.stderr.read()
    assert code == 0, (code, stderr)
    assert took < 5.0, took
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    assert len(answers) == 2
    for answer in answers:
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["type"] == "ShuttingDown"
        assert "shutting down" in error["message"]
    assert not [pid for pid in kernel_pids if psutil.pid_exists(pid)]


def test_sigterm_while_a_template_starts_answers_503_and_logs_no_traceback(
    tmp_path: Path,
) -> None:
    setup = tmp_path / "slow.py"
    setup.write_text("import time\ntime.sleep(60)\n")
    setup.chmod(0o644)
    answers: list[httpx.Response | BaseException] = []
    with _serve(tmp_path, "--template", f"slow={setup}") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "listening on" in line, line
        url = line.rsplit(" ", 1)[-1].strip()
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as client:

            def create() -> None:
                try:
                    answers.append(client.post("/kernels", json={"template": "slow"}))
                except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                    answers.append(exc)

            starting = threading.Thread(target=create)
            starting.start()
            deadline = time.monotonic() + 30
            while not _descendants(proc.pid):  # the template's kernel is up, its setup runs
                assert time.monotonic() < deadline, "the template's kernel never started"
                time.sleep(0.05)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            starting.join(20)
            code = proc.wait(20)
        stderr = proc.stderr.read()
    assert code == 0, (code, stderr)
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    assert len(answers) == 1 and isinstance(answers[0], httpx.Response), answers
    assert answers[0].status_code == 503, answers[0].text
    assert answers[0].json()["error"]["type"] == "ShuttingDown"
