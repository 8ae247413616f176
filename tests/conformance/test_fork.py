"""Fork: copies of a live kernel on every backend that forks (subprocess, bwrap).

Every test ends with no process of its own left: the autouse fixture compares this process's
descendants before and after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import psutil
import pytest

from sunroom import AsyncKernel, Kernel, Limits
from sunroom.errors import ForkError, UsageError
from sunroom.sandbox.forking import ForkedProcess

pytestmark = pytest.mark.usefixtures("no_process_left")


@pytest.fixture
async def kernel(fork_backend: str) -> AsyncIterator[AsyncKernel]:
    backend = fork_backend
    async with AsyncKernel(backend=backend, functions=[triple], limits=Limits(timeout_s=5)) as k:
        yield k


def triple(x: int) -> int:
    """Three times *x*."""
    return 3 * x


async def _close(*kernels: AsyncKernel) -> None:
    for k in kernels:
        await k.aclose()


async def test_copies_start_from_the_parents_state_and_then_diverge(kernel: AsyncKernel) -> None:
    r = await kernel.execute(
        "import os\nx = [1]\nopen('before.txt', 'w').write('parent')\nparent_dir = os.getcwd()"
    )
    assert r.ok, r
    a, b = await kernel.fork(2)
    try:
        for i, copy in enumerate((a, b)):
            r = await copy.execute(
                f"x.append({i})\nopen('mine.txt', 'w').write('copy {i}')\n"
                "(x, open('before.txt').read(), os.getcwd() != parent_dir)"
            )
            assert r.ok, r
            assert r.value == f"([1, {i}], 'parent', True)"
        r = await kernel.execute("(x, os.path.exists('mine.txt'), sorted(os.listdir('.')))")
        assert r.value == "([1], False, ['before.txt'])"
        assert (await kernel.files.list()) and [e.path for e in await kernel.files.list()] == [
            "before.txt"
        ]
        assert await a.files.read("mine.txt") == b"copy 0"
        assert await b.files.read("mine.txt") == b"copy 1"
        await kernel.execute("open('after.txt', 'w').write('late')")
        assert (await a.execute("os.path.exists('after.txt')")).value == "False"
    finally:
        await _close(a, b)


async def test_host_functions_and_output_work_in_a_copy(kernel: AsyncKernel) -> None:
    seen: list[tuple[str, str]] = []
    (copy,) = await kernel.fork(on_output=lambda name, text: seen.append((name, text)))
    try:
        r = await copy.execute("print('from the copy')\ntriple(14)")
        assert r.ok, r
        assert r.value == "42"
        assert r.stdout == "from the copy\n"
        assert "".join(text for name, text in seen if name == "stdout") == "from the copy\n"
        assert (await kernel.execute("triple(2)")).value == "6"
        r = await kernel.execute("print('parent')")
        assert r.stdout == "parent\n"
    finally:
        await copy.aclose()


async def test_a_copy_has_its_own_process_supervisor_and_cgroup(kernel: AsyncKernel) -> None:
    (copy,) = await kernel.fork()
    try:
        proc = copy.process
        assert isinstance(proc, ForkedProcess)
        parent_pid = await kernel.execute("__import__('os').getpid()")
        copy_pid = await copy.execute("__import__('os').getpid()")
        assert parent_pid.value != copy_pid.value
        root = kernel.process
        assert root is not None
        root_cgroup = getattr(root, "cgroup", None)
        if root_cgroup is not None:
            assert proc.cgroup is not None
            assert proc.runtime_pid in proc.cgroup.pids()
            assert proc.runtime_pid not in root_cgroup.pids()
            # one fork per copy: the copy is one process, its cgroup is what holds the rest
            assert proc.single and proc.pid == proc.runtime_pid
            assert proc.cgroup.pids() == {proc.runtime_pid}
        else:  # no cgroup of its own (docker): a supervisor of its own reaps for it
            assert not proc.single and proc.pid != proc.runtime_pid
    finally:
        await copy.aclose()


async def test_a_crash_or_timeout_in_a_copy_leaves_the_others_alone(kernel: AsyncKernel) -> None:
    await kernel.execute("x = 7")
    a, b = await kernel.fork(2)
    try:
        r = await a.execute("import os\nos._exit(3)")
        assert r.status == "died" and r.state_lost
        assert r.error is not None and "status 3" in r.error.message
        assert (await a.execute("'x' in globals()")).value == "False"  # restarted cold
        r = await b.execute(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "while True: time.sleep(0.01)",
            timeout_s=0.5,
        )
        assert r.status == "timeout" and r.state_lost
        r = await b.execute("x", timeout_s=0.5)
        assert r.ok is False or r.value != "7"
        assert (await kernel.execute("x")).value == "7"
        (c,) = await kernel.fork()
        try:
            r = await c.execute("while True: pass", timeout_s=0.5)
            assert r.status == "timeout" and not r.state_lost  # interrupted, state kept
            assert (await c.execute("x")).value == "7"
        finally:
            await c.aclose()
    finally:
        await _close(a, b)


async def test_closing_a_copy_reaps_its_daemons_and_spares_the_parent(
    kernel: AsyncKernel,
) -> None:
    (copy,) = await kernel.fork()
    r = await copy.execute(
        "import subprocess, time\n"
        "subprocess.Popen(['/bin/sh', '-c', '(setsid sleep 1013 &) ; exit 0']).wait()\n"
        "time.sleep(0.2)"
    )
    assert r.ok, r

    def strays() -> list[int]:
        return [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and p.info["cmdline"][-1:] == ["1013"]
        ]

    assert strays()
    await copy.aclose()
    deadline = time.monotonic() + 5
    while strays() and time.monotonic() < deadline:  # noqa: ASYNC110 - polling the OS
        await asyncio.sleep(0.05)
    assert strays() == []
    assert (await kernel.execute("1 + 1")).value == "2"


async def test_copies_outlive_the_parent_and_the_last_closes_the_sandbox(
    kernel: AsyncKernel,
) -> None:
    await kernel.execute("x = 5")
    root = kernel.process
    assert root is not None
    a, b = await kernel.fork(2)
    await kernel.aclose()
    try:
        assert (await a.execute("x + 1")).value == "6"
        await a.aclose()
        assert (await b.execute("x + 2")).value == "7"
        (grandchild,) = await b.fork()
        await b.aclose()
        assert (await grandchild.execute("x + 3")).value == "8"
    finally:
        await _close(a, b)
    await grandchild.aclose()


async def test_a_fork_of_a_fork(kernel: AsyncKernel) -> None:
    await kernel.execute("depth = 0")
    (child,) = await kernel.fork()
    await child.execute("depth += 1")
    (grandchild,) = await child.fork()
    try:
        await grandchild.execute("depth += 1")
        assert (await grandchild.execute("depth")).value == "2"
        assert (await child.execute("depth")).value == "1"
        assert (await kernel.execute("depth")).value == "0"
        assert (await grandchild.execute("triple(depth)")).value == "6"
    finally:
        await _close(grandchild, child)


async def test_fork_is_refused_while_busy_or_with_threads_running(kernel: AsyncKernel) -> None:
    cell = asyncio.ensure_future(kernel.execute("import time\ntime.sleep(1)"))
    await asyncio.sleep(0.2)
    with pytest.raises(ForkError, match="busy"):
        await kernel.fork()
    assert (await cell).ok
    r = await kernel.execute(
        "import threading, time\nstop = threading.Event()\n"
        "t = threading.Thread(target=stop.wait, name='worker-1')\nt.start()"
    )
    assert r.ok, r
    with pytest.raises(ForkError, match="worker-1"):
        await kernel.fork()
    await kernel.execute("stop.set(); t.join()")
    (copy,) = await kernel.fork()
    await copy.aclose()
    for bad in (0, 65):
        with pytest.raises(UsageError, match="1 to 64"):
            await kernel.fork(bad)


def test_the_sync_twin_forks(fork_backend: str) -> None:
    with Kernel(backend=fork_backend) as k:
        k.execute("x = 1")
        (copy,) = k.fork()
        k.close()
        assert copy.execute("x + 1").value == "2"
        copy.close()


def _strays(tag: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and p.info["cmdline"][-1:] == [tag]
    ]


async def _gone(tag: str) -> list[int]:
    deadline = time.monotonic() + 5
    while _strays(tag) and time.monotonic() < deadline:  # noqa: ASYNC110 - polling the OS
        await asyncio.sleep(0.05)
    return _strays(tag)


async def test_a_copys_daemon_outlives_the_parent_and_dies_with_the_copy(
    kernel: AsyncKernel,
) -> None:
    daemon = "import subprocess\nsubprocess.Popen(['/bin/sh', '-c', '(setsid sleep {} &) ; exit 0']).wait()"
    (copy,) = await kernel.fork()
    assert (await copy.execute(daemon.format(1021))).ok
    assert (await kernel.execute(daemon.format(1022))).ok
    await asyncio.sleep(0.2)
    assert _strays("1021") and _strays("1022")
    await kernel.aclose()  # the parent's daemon goes with it; the copy's stays with the copy
    assert await _gone("1022") == []
    assert _strays("1021")
    assert (await copy.execute("1 + 1")).value == "2"
    await copy.aclose()
    assert await _gone("1021") == []


async def test_a_copy_that_outlived_its_parent_reports_how_it_died(kernel: AsyncKernel) -> None:
    a, b = await kernel.fork(2)
    await kernel.aclose()
    try:
        r = await a.execute("import os\nos._exit(5)")
        assert r.status == "died" and r.error is not None
        assert "status 5" in r.error.message
        r = await b.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        assert r.status == "died" and r.error is not None
        assert "SIGKILL" in r.error.message
    finally:
        await _close(a, b)


FORGE = """
import gc, os, socket
from sunroom.prelude.runtime import Runtime
rt = next(o for o in gc.get_objects() if isinstance(o, Runtime))
reg = socket.socket(fileno=os.dup(rt.registry_fd))
r, w = os.pipe()
sent = 0
for message in (b"", b"junk", b"\\t", b"-1\\t/", b"99999999\\t/", b"123456789012\\t/",
                f"{os.getpid()}\\t/".encode(),
                f"{os.getppid()}\\t/".encode(), b"1\\t/"):
    try:
        socket.send_fds(reg, [message or b"x"], [w, w, w])
        sent += 1
    except OSError:
        pass
for _ in range(300):  # past the supervisor's cap on owned copies
    socket.send_fds(reg, [f"{os.getpid()}\\t".encode()], [w])
reg.close()
sent
"""


async def test_forged_registry_messages_change_nothing(kernel: AsyncKernel) -> None:
    await kernel.execute("x = 1")
    r = await kernel.execute(FORGE)
    assert r.ok, r
    assert r.value == "9"
    (copy,) = await kernel.fork()
    assert (await copy.execute("x + 1")).value == "2"
    assert (await kernel.execute("x + 2")).value == "3"
    await copy.aclose()
    await kernel.aclose()  # and the fixture checks that no process is left


async def test_a_fork_refused_for_its_descriptors_keeps_none_of_them(kernel: AsyncKernel) -> None:
    """The copies' descriptors come with the fork request; a request whose count does not
    match its copies is refused, and the kernel closes every descriptor that came with it."""
    import os
    import socket

    from sunroom.rpc import schema
    from sunroom.rpc.channel import RemoteError

    assert (await kernel.execute("1")).ok
    pid = kernel.process.host_pid if kernel.process is not None else None  # docker: None

    def fds() -> list[str]:
        return sorted(os.listdir(f"/proc/{pid}/fd")) if pid is not None else []

    before = fds()
    channel = kernel._core.channel  # noqa: SLF001 - the wire itself is under test
    assert channel is not None
    mine, theirs = socket.socketpair()
    r, w = os.pipe()
    try:
        spec = {"nonce": "ab" * 16, "workdir": "/tmp/never"}
        call = channel.request(
            "fork",
            {"copies": [spec], "fds": 3},
            check=schema.pids,
            fds=[theirs.fileno(), w, w],
        )
        with pytest.raises(RemoteError, match="wrong number of descriptors"):
            await asyncio.wait_for(call, 20)
        assert fds() == before
        theirs.close()
        os.close(w)
        assert os.read(r, 1) == b""  # the kernel holds no copy of the pipe's write end
        mine.settimeout(5)
        assert mine.recv(1) == b""  # nor of the socket
    finally:
        mine.close()
        os.close(r)
    assert (await kernel.execute("1 + 1")).value == "2"


OWN_FDS = """
import signal
from sunroom.prelude.fds import open_fds
runtime = signal.getsignal(signal.SIGINT).__self__  # the runtime's own SIGINT handler
(sorted(runtime.own_fds), sorted(open_fds()))
"""


async def test_a_copy_knows_its_own_descriptors_from_those_a_cell_opened(
    kernel: AsyncKernel,
) -> None:
    # a copy counts its descriptors in and out (no listing): what it holds must be exactly
    # what a fresh listing finds, less what a cell of the parent opened (a stray in it too)
    opened = await kernel.execute("import os\nstray = os.open(os.devnull, os.O_RDONLY)\nstray")
    assert opened.ok, opened
    stray = int(opened.value or "-1")
    (copy,) = await kernel.fork()
    (grandchild,) = await copy.fork()
    try:
        for k in (kernel, copy, grandchild):
            result = await k.execute(OWN_FDS)
            assert result.ok, result
            own, listed = eval(result.value or "")  # noqa: S307 - two lists of ints
            assert stray in listed
            assert own == [fd for fd in listed if fd != stray]
    finally:
        await _close(grandchild, copy)


CHILDREN = """
import glob
sorted(int(p) for f in glob.glob('/proc/self/task/*/children') for p in open(f).read().split())
"""


NPROC_HEADROOM = """
import os, resource
mine = 0
for pid in os.listdir('/proc'):
    try:
        with open(f'/proc/{pid}/status') as f:
            fields = dict(line.split(':', 1) for line in f)
    except (OSError, ValueError):
        continue
    if fields.get('Uid', '').split()[:1] == [str(os.getuid())]:
        mine += int(fields['Threads'])
resource.setrlimit(resource.RLIMIT_NPROC, (mine + 3, mine + 3))  # three more tasks, no more
"""


async def test_a_fork_cut_short_leaves_no_copy_behind(kernel: AsyncKernel) -> None:
    # the kernel's user may start three more tasks (a copy and its reader thread count): its
    # forks fail part way, the error comes back in one sentence, the copies already forked
    # are let go (their host ends close) and reaped, and the kernel goes on
    assert (await kernel.execute("x = 41")).ok
    assert (await kernel.execute(NPROC_HEADROOM)).ok
    with pytest.raises(
        ForkError, match=r"could not fork copy \d+ of 30: the kernel may start no more processes"
    ):
        await kernel.fork(30)
    assert (await kernel.execute("x + 1")).value == "42"
    deadline = time.monotonic() + 5
    while (left := await kernel.execute(CHILDREN)).value != "[]":
        assert time.monotonic() < deadline, f"copies left unreaped: {left.value}"
        await asyncio.sleep(0.05)
    (copy,) = await kernel.fork()  # and it forks again once it may
    try:
        assert (await copy.execute("x + 2")).value == "43"
    finally:
        await copy.aclose()
