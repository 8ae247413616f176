"""The supervisor as the cgroup gate: nothing of the kernel is forked before the host's ``go``.

The subprocess backend starts sunroom's supervisor at once and moves it into the kernel's
cgroup while the interpreter starts; the supervisor waits on stdin before it forks the
runtime (sunroom.prelude.supervisor._await_gate). These tests drive a real supervisor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunroom.prelude.supervisor import GATE_CLOSED
from sunroom.prelude.watch import children
from sunroom.sandbox.backends.subprocess import boot_argv, kernel_sys_path

NONCE = "ab" * 16


@pytest.fixture
def gated() -> Iterator[tuple[subprocess.Popen[bytes], socket.socket]]:
    """A supervisor with a gate, parked at it, and the host's end of its socket."""
    host, kernel = socket.socketpair()
    config = {"fd": kernel.fileno(), "nonce": NONCE, "max_frame": 1 << 20, "gate": True}
    proc = subprocess.Popen(
        boot_argv(sys.executable, kernel_sys_path(), config),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        pass_fds=[kernel.fileno()],
        start_new_session=True,
    )
    kernel.close()
    try:
        _wait_at_gate(proc.pid)
        yield proc, host
    finally:
        host.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()


def _wait_at_gate(pid: int) -> None:
    """Until *pid* blocks in read(0, ...): its imports are done and it waits at the gate."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
        if fields[:2] == ["0", "0x0"]:  # read(2) on fd 0
            return
        time.sleep(0.005)
    raise AssertionError("the supervisor never reached its gate")


def test_nothing_is_forked_and_nothing_said_before_go(
    gated: tuple[subprocess.Popen[bytes], socket.socket],
) -> None:
    proc, host = gated
    time.sleep(0.2)
    assert children(proc.pid) == []
    host.setblocking(False)
    with pytest.raises(BlockingIOError):
        host.recv(1)
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    host.setblocking(True)
    host.settimeout(20)
    assert b"hello" in host.recv(4096)
    (runtime,) = children(proc.pid)
    assert os.readlink(f"/proc/{runtime}/fd/0") == "/dev/null"  # the gate is not inherited


@pytest.mark.parametrize("word", [b"", b"no\n"])
def test_a_gate_closed_without_go_ends_the_supervisor_having_forked_nothing(
    gated: tuple[subprocess.Popen[bytes], socket.socket], word: bytes
) -> None:
    proc, host = gated
    assert proc.stdin is not None
    proc.stdin.write(word)
    proc.stdin.close()
    assert proc.wait(timeout=20) == GATE_CLOSED
    host.settimeout(20)
    assert host.recv(1) == b""  # no hello: the runtime never existed


@pytest.fixture
def broken_python() -> Iterator[str]:
    """An "interpreter" that says why it fails and exits 3, where any uid can run it."""
    where = Path(tempfile.mkdtemp(prefix="sunroom-broken-"))
    try:
        where.chmod(0o755)  # as root the kernel runs as another uid, which must reach it
        broken = where / "python"
        broken.write_text("#!/bin/sh\necho 'this interpreter is broken on purpose' >&2\nexit 3\n")
        broken.chmod(0o755)
        yield str(broken)
    finally:
        shutil.rmtree(where)


async def test_a_launch_that_ends_at_its_gate_is_reported_with_its_log(broken_python: str) -> None:
    """Ending before the host's move (the supervisor imports there) or before its ``go`` is
    the kernel's own failure, told with its log, never a failed cgroup move; ten times, as
    the race goes one way or the other."""
    from sunroom import AsyncKernel
    from sunroom.errors import KernelStartError
    from sunroom.sandbox.backends.subprocess import SubprocessBackend

    for _ in range(10):
        with pytest.raises(KernelStartError) as info:
            async with AsyncKernel(backend=SubprocessBackend(python=broken_python)):
                pass
        assert "ended before saying hello" in str(info.value)
        assert "broken on purpose" in str(info.value)
