"""The kernel side of the jupyter backend: the supervisor's exec mode, the IPython extension and
the keeper, driven directly (no host-side sunroom code): a real supervisor on a socketpair, a
real ipykernel / bash_kernel on ZeroMQ ``ipc`` sockets, a real jupyter-client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import write_connection_file

from sunroom.prelude.ipython import IPYTHON_NAMES
from sunroom.prelude.supervisor import CHANNEL_ENV, EXEC_FAILED
from sunroom.rpc.channel import Channel, RemoteError
from sunroom.rpc.codec import DEFAULT_MAX_FRAME, PROTOCOL_VERSION
from sunroom.sandbox.backends.subprocess import boot_argv, kernel_sys_path, package_root
from sunroom.sandbox.codegen import generate
from sunroom.sandbox.functions import as_host_function
from sunroom.sandbox.limits import Limits

EXTENSION_FLAG = "--IPKernelApp.extra_extensions=sunroom.prelude.ipython"
"""The ipykernel (7.4) option that loads the extension; ``--ext=sunroom.prelude.ipython`` (its
alias) and ``--IPKernelApp.extensions=sunroom.prelude.ipython`` work too, but the latter
replaces the extensions a configuration file lists instead of adding to them."""


def double(x: int) -> int:
    """Twice *x*."""
    return 2 * x


def hold() -> str:
    """Blocks until the test releases it."""
    raise AssertionError("served by the test's host")


WRAPPERS = generate([as_host_function(double), as_host_function(hold)])


@dataclass
class Host:
    """The host end: the channel, what the kernel said and the host functions it serves."""

    channel: Channel
    hello: asyncio.Future[Any]
    supervisor: subprocess.Popen[bytes]
    workdir: Path
    kernel_fd: int
    nonce: str
    log: Path
    release: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[str] = field(default_factory=list)
    held: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, method: str, params: Any) -> Any:
        assert method == "call"
        self.calls.append(params["name"])
        if params["name"] == "double":
            return double(params["args"]["x"])
        self.held.set()
        await self.release.wait()
        self.release.clear()
        return "released"

    def tree(self) -> list[psutil.Process]:
        """The supervisor and every live descendant."""
        try:
            sup = psutil.Process(self.supervisor.pid)
            return [sup, *sup.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def _connection_file(tmp: Path) -> Path:
    path = tmp / "kernel.json"
    write_connection_file(str(path), transport="ipc", ip=str(tmp / "k"))
    return path


def _start_supervisor(
    config: dict[str, Any], workdir: Path, kernel_end: socket.socket, log: Path
) -> subprocess.Popen[bytes]:
    """The supervisor as the subprocess backend starts it (``-I -S``, a scrubbed environment);
    its stdout and stderr (and the kernel's) go to *log*."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8"}
    with log.open("ab") as out:
        return subprocess.Popen(
            boot_argv(sys.executable, kernel_sys_path(), config),
            pass_fds=[kernel_end.fileno()],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )


def _fd_links(pid: int) -> set[str]:
    """What every open fd of process *pid* points at."""
    return {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}


def _close_on_exec(pid: int, fd: int) -> bool:
    """Whether *fd* of process *pid* has ``O_CLOEXEC`` (read from ``/proc/<pid>/fdinfo``)."""
    lines = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
    flags = next(line.split()[1] for line in lines if line.startswith("flags:"))
    return bool(int(flags, 8) & os.O_CLOEXEC)


@contextlib.asynccontextmanager
async def supervised(
    tmp: Path, argv: list[str], *, attach: bool, name: str | None = None
) -> AsyncIterator[Host]:
    """Start the supervisor in exec mode on a socketpair; kill what is left at the end."""
    workdir = tmp / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    host_end, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    nonce = secrets.token_hex(16)
    config = {
        "fd": kernel_end.fileno(),
        "nonce": nonce,
        "max_frame": DEFAULT_MAX_FRAME,
        "rlimits": Limits().rlimits(),  # the defaults every kernel gets
        "exec": {
            "argv": argv,
            "env": {"PYTHONPATH": package_root()},
            "attach": attach,
            **({"name": name} if name else {}),
        },
    }
    proc = _start_supervisor(config, workdir, kernel_end, tmp / "kernel.log")
    kernel_fd = kernel_end.fileno()
    kernel_end.close()
    hello: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def on_notification(method: str, params: Any) -> None:
        if method == "hello" and not hello.done():
            hello.set_result(params)

    host: Host | None = None

    async def serve(method: str, params: Any) -> Any:
        assert host is not None
        return await host.serve(method, params)

    channel = await Channel.open(host_end, handler=serve, on_notification=on_notification)
    host = Host(channel, hello, proc, workdir, kernel_fd, nonce, tmp / "kernel.log")
    try:
        yield host
    finally:
        await channel.aclose()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        print(host.log.read_text(errors="replace"))  # shown when the test fails


@contextlib.asynccontextmanager
async def client(connection: Path) -> AsyncIterator[AsyncKernelClient]:
    kc = AsyncKernelClient()
    kc.load_connection_file(str(connection))
    # no heartbeat: a client without a manager judges the kernel dead after one pong slower
    # than 1 s (seen on a loaded machine while bash_kernel starts); the tests watch processes
    kc.start_channels(hb=False)
    try:
        await kc.wait_for_ready(timeout=30)
        yield kc
    finally:
        kc.stop_channels()


async def run(kc: AsyncKernelClient, code: str) -> tuple[str, dict[str, Any]]:
    """Execute *code*; its stdout and the reply's content."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = await kc.execute_interactive(code, output_hook=hook, allow_stdin=False, timeout=20)
    return "".join(out), reply["content"]


async def until(check: Callable[[], bool], within_s: float = 10) -> None:
    end = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


def _map(value: object) -> dict[str, Any]:
    assert isinstance(value, dict), value
    return value


def _list(value: object) -> list[Any]:
    assert isinstance(value, list), value
    return value


async def write_file(channel: Channel, path: str, data: bytes) -> None:
    opened = _map(await channel.call("file_write_open", {"path": path}))
    await channel.call("file_write_chunk", {"handle": opened["handle"], "data": data})
    await channel.call("file_write_close", {"handle": opened["handle"], "commit": True})


async def read_file(channel: Channel, path: str) -> bytes:
    opened = _map(await channel.call("file_read_open", {"path": path}))
    data = await channel.call("file_read_chunk", {"handle": opened["handle"], "size": 1 << 16})
    await channel.call("file_read_close", {"handle": opened["handle"]})
    assert isinstance(data, bytes), data
    return data


def ipykernel_argv(connection: Path) -> list[str]:
    return [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection), EXTENSION_FLAG]


async def test_ipykernel_attaches_serves_the_channel_and_dies_with_it(tmp_path: Path) -> None:
    connection = _connection_file(tmp_path)
    # a slow start-up file: the host's bind surely lands before IPython's start-up ends (and
    # IPython then hides every name in the namespace from %who and the like)
    startup = tmp_path / "work" / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-slow.py").write_text("import time\ntime.sleep(0.5)\n")
    async with supervised(tmp_path, ipykernel_argv(connection), attach=True) as host:
        hello = await asyncio.wait_for(host.hello, 30)
        kernel = psutil.Process(hello["pid"])
        assert kernel.ppid() == host.supervisor.pid  # the exec'd child itself, not a helper
        assert "ipykernel_launcher" in kernel.cmdline()
        assert hello["python"] == sys.version.split()[0]
        assert hello["nonce"] == host.nonce and hello["protocol"] == PROTOCOL_VERSION
        channel = host.channel
        names = _list(
            await channel.call(
                "install", {"source": WRAPPERS.source, "exports": list(WRAPPERS.exports)}
            )
        )
        assert set(names) == {"double", "hold"}
        assert await channel.call("bind", {"values": {"n": 21, "label": "x"}}) == ["n", "label"]
        await write_file(channel, "in.txt", b"from the host")
        async with client(connection) as kc:
            out, reply = await run(kc, "print(double(n), label, open('in.txt').read())")
            assert reply["status"] == "ok", reply
            assert out == "42 x from the host\n"
            assert host.calls == ["double"]
            out, reply = await run(
                kc,
                "import getpass\n"
                "for _read in (input, getpass.getpass):\n"
                "    try:\n"
                "        _read('? ')\n"
                "    except EOFError as exc:\n"
                "        print(type(exc).__name__, exc)",
            )
            assert reply["status"] == "ok", reply
            assert out == "EOFError EOF when reading a line: the kernel has no stdin\n" * 2
            out, reply = await run(kc, "%reload_ext sunroom.prelude.ipython")  # a no-op
            assert reply["status"] == "ok" and out == "", (reply, out)
            out, reply = await run(kc, "import os\nopen('out.txt', 'w').write('cell'); y = [1]")
            assert reply["status"] == "ok", reply
            assert await read_file(channel, "out.txt") == b"cell"
            listed = {v["name"]: v for v in _list(await channel.call("variables"))}
            assert set(listed) == {"n", "label", "y"}, listed  # not IPython's own names
            assert listed["y"] == {"name": "y", "type": "list", "repr": "[1]"}
            assert not IPYTHON_NAMES & set(listed)
            with pytest.raises(RemoteError, match="execute_request") as refused:
                await channel.call("execute", {"code": "1"})
            assert refused.value.error.type == "MethodNotFound"
            # the channel stays in the kernel: not in the environment, not in children's fds
            out, reply = await run(
                kc,
                f"import os\nprint({CHANNEL_ENV!r} in os.environ)\n"
                f"!env | grep -c {CHANNEL_ENV} || true\n"
                "!ls -l /proc/self/fd | grep -c socket: || true\n"
                "os.system('ls -l /proc/self/fd > system_fds.txt')",  # inherits all it can
            )
            assert reply["status"] == "ok", reply
            assert out.split() == ["False", "0", "0"], out
            # the kernel itself holds it, close-on-exec
            link = os.readlink(f"/proc/{kernel.pid}/fd/{host.kernel_fd}")
            assert link.startswith("socket:") and _close_on_exec(kernel.pid, host.kernel_fd)
            assert link not in (await read_file(channel, "system_fds.txt")).decode()
        assert len(host.tree()) == 2  # supervisor and kernel: nothing else left running
        await host.channel.aclose()  # the host goes away: the whole tree ends
        await until(lambda: host.supervisor.poll() is not None)
        assert host.tree() == []


async def test_sigint_interrupts_a_cell_blocked_in_a_host_call(tmp_path: Path) -> None:
    connection = _connection_file(tmp_path)
    async with supervised(tmp_path, ipykernel_argv(connection), attach=True) as host:
        hello = await asyncio.wait_for(host.hello, 30)
        channel = host.channel
        await channel.call("install", {"source": WRAPPERS.source, "exports": ["double", "hold"]})
        async with client(connection) as kc:
            cell = asyncio.ensure_future(run(kc, "hold()"))
            await asyncio.wait_for(host.held.wait(), 20)
            await asyncio.sleep(0.1)
            os.kill(hello["pid"], signal.SIGINT)
            out, reply = await asyncio.wait_for(cell, 20)
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
            host.release.set()  # the late answer to the abandoned call is dropped
            await asyncio.sleep(0.1)
            out, reply = await run(kc, "print(double(5)); print(double(6))")
            assert reply["status"] == "ok", reply
            assert out == "10\n12\n"
            out, reply = await run(  # from threads a cell starts, many at once
                kc,
                "from concurrent.futures import ThreadPoolExecutor\n"
                "with ThreadPoolExecutor(8) as pool:\n"
                "    print(sum(pool.map(double, range(100))))",
            )
            assert out == f"{sum(2 * i for i in range(100))}\n", (out, reply)
            # a host call while the serving thread is busy answering requests
            host.calls.clear()
            cell = asyncio.ensure_future(run(kc, "print(sum(double(i) for i in range(200)))"))
            for _ in range(50):
                await channel.call("variables")
            out, reply = await asyncio.wait_for(cell, 20)
            assert out == f"{sum(2 * i for i in range(200))}\n" and len(host.calls) == 200
        assert await channel.call("shutdown") is True
        await until(lambda: host.supervisor.poll() is not None)
        assert host.supervisor.returncode == 0
        assert host.tree() == []


async def test_bash_kernel_gets_a_keeper(tmp_path: Path) -> None:
    connection = _connection_file(tmp_path)
    argv = [sys.executable, "-m", "bash_kernel", "-f", str(connection)]
    async with supervised(tmp_path, argv, attach=False, name="bash") as host:
        hello = await asyncio.wait_for(host.hello, 30)
        kernel = psutil.Process(hello["pid"])
        assert kernel.ppid() == host.supervisor.pid
        assert "bash_kernel" in kernel.cmdline()
        assert "python" not in hello
        assert hello["nonce"] == host.nonce and hello["protocol"] == PROTOCOL_VERSION
        channel = host.channel
        await write_file(channel, "data.txt", b"hello bash\n")
        async with client(connection) as kc:
            out, reply = await run(kc, "cat data.txt; echo made > made.txt; ls /proc/self/fd")
            assert reply["status"] == "ok", reply
            assert out.startswith("hello bash\n")
            assert await read_file(channel, "made.txt") == b"made\n"
            cell = asyncio.ensure_future(run(kc, "sleep 30"))
            await asyncio.sleep(0.5)
            os.kill(kernel.pid, signal.SIGINT)  # as jupyter-client interrupts it
            out, reply = await asyncio.wait_for(cell, 10)
            assert reply["status"] == "abort", reply
            out, reply = await run(kc, "echo still here")
            assert out == "still here\n", (out, reply)
            # the kernel never had the channel: only the keeper (the supervisor's other child)
            (keeper,) = [p for p in psutil.Process(host.supervisor.pid).children() if p != kernel]
            link = os.readlink(f"/proc/{keeper.pid}/fd/{host.kernel_fd}")
            assert link.startswith("socket:")
            assert link not in _fd_links(kernel.pid)
            assert CHANNEL_ENV not in kernel.environ()
            for method in ("install", "bind", "variables", "execute", "fork"):
                with pytest.raises(
                    RemoteError, match="the bash Jupyter kernel has no sunroom runtime"
                ) as refused:
                    await channel.call(method, {})
                assert refused.value.error.type == "Unsupported"
        await channel.aclose()
        await until(lambda: host.supervisor.poll() is not None)
        assert host.tree() == []


async def test_exec_mode_resets_signals_and_reports_a_missing_program(tmp_path: Path) -> None:
    argv = [
        "/bin/sh",
        "-c",
        "grep -E '^Sig(Ign|Blk)' /proc/self/status > sig.txt; ls /proc/self/fd > fds.txt",
    ]
    async with supervised(tmp_path, argv, attach=False) as host:
        await until(lambda: host.supervisor.poll() is not None)
        status = (host.workdir / "sig.txt").read_text().split()
        assert status == ["SigBlk:", "0000000000000000", "SigIgn:", "0000000000000000"]
        assert sorted(int(x) for x in (host.workdir / "fds.txt").read_text().split()) == [
            0,
            1,
            2,
            3,
        ]
    async with supervised(tmp_path / "b", ["no-such-kernel-program"], attach=False) as host:
        await until(lambda: host.supervisor.poll() is not None)
        await asyncio.wait_for(host.channel.closed, 10)
        assert not host.hello.done()  # no keeper speaks for a program that never ran
        assert host.supervisor.returncode == EXEC_FAILED
        err = host.log.read_text()
        assert (
            err
            == "sunroom: cannot run the kernel program 'no-such-kernel-program': No such file or directory\n"
        )
    async with supervised(tmp_path / "c", [], attach=True) as host:
        await asyncio.wait_for(host.channel.closed, 10)
        await until(lambda: host.supervisor.poll() is not None)
        assert host.supervisor.returncode == 1
        assert "ValueError: the kernel program's argv is empty" in host.log.read_text()


@dataclass
class FakeShell:
    """The two attributes of an IPython shell the extension reads."""

    user_ns: dict[str, Any] = field(default_factory=dict)
    user_ns_hidden: dict[str, Any] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, f"needs {CHANNEL_ENV}: only sunroom's jupyter backend loads this extension"),
        (
            "{not json",
            rf"{CHANNEL_ENV} is not JSON with fd, nonce and max_frame \(JSONDecodeError\)",
        ),
        ('{"fd": 3}', rf"{CHANNEL_ENV} is not JSON with fd, nonce and max_frame \(KeyError\)"),
    ],
)
def test_the_extension_refuses_to_load_without_its_channel(
    monkeypatch: pytest.MonkeyPatch, value: str | None, message: str
) -> None:
    from sunroom.prelude import hostcall
    from sunroom.prelude.ipython import load_ipython_extension

    assert not hostcall.attached()
    if value is None:
        monkeypatch.delenv(CHANNEL_ENV, raising=False)
    else:
        monkeypatch.setenv(CHANNEL_ENV, value)
    with pytest.raises(RuntimeError, match=message):
        load_ipython_extension(FakeShell())
    assert CHANNEL_ENV not in os.environ and not hostcall.attached()


async def test_the_program_is_the_kernel_its_end_ends_the_keeper(tmp_path: Path) -> None:
    async with supervised(tmp_path, ["/bin/sh", "-c", "exec sleep 60"], attach=False) as host:
        hello = await asyncio.wait_for(host.hello, 10)
        await until(lambda: psutil.Process(hello["pid"]).name() == "sleep")
        assert len(host.tree()) == 3  # supervisor, program, keeper
        with pytest.raises(RemoteError, match="this Jupyter kernel has no sunroom runtime"):
            await host.channel.call("variables")
        os.kill(hello["pid"], signal.SIGKILL)
        await asyncio.wait_for(host.channel.closed, 10)  # the keeper was swept with it
        await until(lambda: host.supervisor.poll() is not None)
        assert host.supervisor.returncode == 128 + signal.SIGKILL
        assert host.tree() == []
    argv = ["/bin/sh", "-c", "exec sleep 60"]
    async with supervised(tmp_path / "b", argv, attach=False) as host:
        await asyncio.wait_for(host.hello, 10)
        assert await host.channel.call("shutdown") is True  # the keeper ends the program
        await until(lambda: host.supervisor.poll() is not None)
        assert host.tree() == []
