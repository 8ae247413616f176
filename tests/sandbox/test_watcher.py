"""The compiled watcher (``sunroom-watch``): chosen, untraceable, equal to the Python one.

The fork conformance cases run with both watchers (tests/conformance/conftest.py); these
check the choice itself, what the exec leaves behind, and the build.
"""

from __future__ import annotations

import ast
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sunroom import AsyncKernel, Template
from sunroom.errors import UsageError
from sunroom.prelude.watch import COMPILED_NAME as watch_module_name
from sunroom.prelude.watch import WATCHED_SIGNALS, become_compiled
from sunroom.sandbox.watcher import BUILT, COMPILED_NAME, ENV_CHOICE, SOURCE, build, stale
from tests.conftest import _require, backends_under_test
from tests.daemons import daemon_cell

WATCHING = backends_under_test(("subprocess", "bwrap", "docker"))

WHO_WATCHES = """
import os
parent = os.getppid()
name = open(f"/proc/{parent}/cmdline").read().split("\\0")[0].rsplit("/", 1)[-1]
try:
    os.readlink(f"/proc/{parent}/exe")
    traceable = True
except PermissionError:
    traceable = False
(name, traceable)
"""


@pytest.fixture(params=WATCHING)
def watching_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv(ENV_CHOICE, raising=False)  # the default
    return _require(str(request.param))


@pytest.fixture
def subprocess_backend() -> str:
    return _require("subprocess")


def test_the_checkout_has_the_watcher_built() -> None:
    assert BUILT.name == COMPILED_NAME == watch_module_name
    """scripts/setup.sh builds it; a missing or stale one here means kernels watch in Python."""
    assert BUILT.is_file() and os.access(BUILT, os.X_OK), f"{BUILT} was not built"
    assert not stale(), f"{BUILT} was not built from watch.c as it is: run sunroom build-helpers"


@pytest.mark.usefixtures("no_process_left")
async def test_a_kernel_is_watched_by_the_compiled_watcher_which_it_cannot_trace(
    watching_backend: str,
) -> None:
    async with AsyncKernel(backend=watching_backend) as k:
        r = await k.execute(WHO_WATCHES)
        assert r.ok, r
        assert r.value == f"({COMPILED_NAME!r}, False)"


COPY_WATCHED = WHO_WATCHES.replace(
    "(name, traceable)", "(name, traceable, os.path.isdir(os.getcwd()))"
)
"""Who watches a copy, whether it can trace it, and whether the copy's workdir is there."""


@pytest.mark.usefixtures("no_process_left")
@pytest.mark.parametrize("choice", ["", "python"])
async def test_a_template_tenant_is_watched_by_the_chosen_watcher_which_it_cannot_trace(
    choice: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bwrap tenant has a supervisor of its own: the watcher the host chose, untraceable."""
    backend = _require("bwrap")
    monkeypatch.setenv(ENV_CHOICE, choice)
    async with Template(setup="x = 1", backend=backend) as template:
        k = await template.kernel()
        try:
            r = await k.execute(COPY_WATCHED)
            assert r.ok and r.value is not None, r
            name, traceable, cwd = ast.literal_eval(r.value)
            assert name.startswith("python") if choice == "python" else name == COMPILED_NAME, r
            assert (traceable, cwd) == (False, True), r
        finally:
            await k.aclose()


@pytest.mark.usefixtures("no_process_left")
async def test_a_docker_copy_is_watched_by_the_compiled_watcher_that_removes_its_workdir() -> None:
    """A docker copy has a supervisor of its own; it removes the copy's workdir at the end."""
    backend = _require("docker")
    async with AsyncKernel(backend=backend) as k:
        (copy,) = await k.fork()
        try:
            r = await copy.execute(COPY_WATCHED)
            assert r.ok and r.value == f"({COMPILED_NAME!r}, False, True)", r
            here = (await copy.execute("import os; os.getcwd()")).value
            assert here is not None and here != (await k.execute("import os; os.getcwd()")).value
        finally:
            await copy.aclose()
        deadline = asyncio.get_running_loop().time() + 10
        while (await k.execute(f"os.path.exists({here})")).value != "False":
            assert asyncio.get_running_loop().time() < deadline, f"{here} was not removed"
            await asyncio.sleep(0.05)


@pytest.mark.usefixtures("no_process_left")
@pytest.mark.parametrize("choice", ["compiled", "python", ""])
async def test_either_watcher_reaps_a_daemon_and_reports_how_the_kernel_died(
    choice: str, monkeypatch: pytest.MonkeyPatch, subprocess_backend: str
) -> None:
    monkeypatch.setenv(ENV_CHOICE, choice)
    marker = f"sunroom-watcher-daemon-{choice}"
    k = AsyncKernel(backend=subprocess_backend)
    await k.start()
    try:
        r = await k.execute(WHO_WATCHES)
        watcher = "python" if choice == "python" else COMPILED_NAME
        assert r.value is not None and r.value.startswith(f"('{watcher}"), r
        r = await k.execute(daemon_cell(marker, "os.kill(os.getpid(), 9)"))
        assert r.status == "died", r
        assert r.error is not None and "SIGKILL" in r.error.message, r
    finally:
        await k.aclose()
    found = [
        p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
    ]
    _, alive = await asyncio.to_thread(psutil.wait_procs, found, timeout=10)
    assert alive == []


async def test_an_unknown_watcher_choice_is_refused(
    monkeypatch: pytest.MonkeyPatch, subprocess_backend: str
) -> None:
    monkeypatch.setenv(ENV_CHOICE, "fast")
    with pytest.raises(
        UsageError,
        match="SUNROOM_WATCHER, which chooses each kernel's watcher, may be 'compiled' \\(the "
        "default\\) or 'python', not 'fast'",
    ):
        await AsyncKernel(backend=subprocess_backend).start()


def test_a_watcher_that_cannot_start_leaves_the_supervisor_watching(tmp_path: Path) -> None:
    """An exec that fails returns, with the mask as it was and the reason on stderr."""
    r, w = os.pipe()
    err = tmp_path / "stderr"
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(r)
            sys.stderr = open(err, "w")  # noqa: SIM115 - the child ends with os._exit
            before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            become_compiled(
                str(tmp_path / "missing"),
                os.getpid(),
                status_fd=None,
                registry_fd=None,
                forward_sigint=False,
                ready_fd=w,
            )
            after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            sys.stderr.flush()
            os.write(w, b"back" if after == before else b"mask")
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as reader:
        said = reader.read()
    os.waitpid(child, 0)
    assert said == b"back"
    assert err.read_text() == (
        "sunroom: the compiled watcher could not start (No such file or directory); "
        "the supervisor watches the kernel itself.\n"
    )
    assert set(WATCHED_SIGNALS) == {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


def test_the_compiled_watcher_ends_a_copy_whose_host_hung_up_and_removes_its_workdir(
    tmp_path: Path,
) -> None:
    """A copy's watcher: the host's end of its socket closes, the runtime is killed (it may be
    stuck in a cell that ignores SIGINT), its status is said, then its workdir is removed."""
    workdir = tmp_path / "copy"
    (workdir / "sub").mkdir(parents=True)
    (workdir / "sub" / "file").write_text("x")
    host_end, copy_end = socket.socketpair()
    status_r, status_w = os.pipe()
    ready_r, ready_w = os.pipe()
    watcher = os.fork()
    if watcher == 0:  # pragma: no cover - it becomes the watcher
        try:
            host_end.close()
            os.close(status_r)
            os.close(ready_r)
            runtime = os.fork()
            if runtime == 0:  # holds none of its watcher's ends, as a copy's runtime
                os.close(ready_w)
                os.close(status_w)
                copy_end.close()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED_SIGNALS)
                time.sleep(60)
                os._exit(0)
            become_compiled(
                str(BUILT),
                runtime,
                status_fd=status_w,
                registry_fd=None,
                forward_sigint=False,
                ready_fd=ready_w,
                hangup_fd=copy_end.fileno(),
                workdir=str(workdir),
            )
        finally:
            os._exit(3)
    copy_end.close()
    os.close(status_w)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b""  # the watcher is up, not dumpable
        assert workdir.is_dir()
        host_end.close()  # the host hangs up
        with os.fdopen(status_r, "rb") as reader:
            said = reader.read()  # to the end: the watcher has exited
    finally:
        os.close(ready_r)
        _, code = os.waitpid(watcher, 0)
    assert said == b"signal:9"
    assert os.waitstatus_to_exitcode(code) == 0
    assert not workdir.exists()


def test_a_program_is_stale_by_its_source_content_not_by_file_times(tmp_path: Path) -> None:
    # pip writes a wheel's files in any order; an edited source must still be seen
    source, out = tmp_path / "watch.c", tmp_path / COMPILED_NAME
    shutil.copy(SOURCE, source)
    assert stale(out, source)  # not built
    assert build(out, source=source) is None
    assert not stale(out, source)
    later = out.stat().st_mtime + 60
    os.utime(source, (later, later))  # newer than the program, same content
    assert not stale(out, source)
    source.write_text(source.read_text() + "\n/* edited */\n")
    os.utime(source, (0, 0))  # older than the program, other content
    assert stale(out, source)


def test_build_says_in_one_sentence_when_there_is_no_compiler(tmp_path: Path) -> None:
    out = tmp_path / COMPILED_NAME
    missing = tmp_path / "no-cc"
    why = build(out, compiler=str(missing))
    assert why == f"the C compiler {missing} could not be run (No such file or directory)"
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no half-written file left beside it


def test_a_built_watcher_refuses_arguments_it_was_not_given_by_a_supervisor(
    tmp_path: Path,
) -> None:
    out = tmp_path / COMPILED_NAME
    assert build(out) is None
    assert out.stat().st_mode & 0o777 == 0o755
    for argv in (
        [],
        ["1", "2"],
        ["x", "-1", "-1", "0", "-1", "-1", ""],
        ["0", "-1", "-1", "0", "-1", "-1", ""],
        ["1", "-1", "-1", "0", "-1"],  # no hangup fd nor workdir
        ["1", "-1", "-1", "0", "-1", "x", ""],
        ["1", "-1", "-1", "0", "-1", "-1", "relative/workdir"],
    ):
        done = subprocess.run([str(out), *argv], capture_output=True, text=True, check=False)
        assert done.returncode == 64, argv
        assert done.stderr.startswith("sunroom-watch: usage: sunroom-watch KERNEL"), argv
        assert done.stderr.count("\n") == 1
