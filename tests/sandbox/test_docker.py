"""The docker backend against the real daemon: the container is what the backend promises.

Needs a running Docker daemon and the offline kernel image (``bash scripts/docker-setup.sh``).
Skipped when docker is unavailable here, or not under test (``SUNROOM_TEST_BACKENDS``); a
failure instead when ``SUNROOM_REQUIRE_BACKENDS`` lists docker.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gc
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import docker  # type: ignore[import-untyped, unused-ignore]
import psutil
import pytest

import sunroom
from sunroom import AsyncKernel, Limits
from sunroom.errors import SandboxUnavailableError, UsageError
from sunroom.sandbox.backend import LaunchSpec
from sunroom.sandbox.backends.docker import RUN_DIR, DockerBackend
from sunroom.sandbox.backends.docker_janitor import (
    LABEL_HOST,
    LABEL_KERNEL,
    LABEL_OWNER_PID,
    LABEL_OWNER_STARTED,
)
from sunroom.sandbox.backends.docker_process import DockerKernelProcess
from sunroom.sandbox.identity import Identity, uid_range


def _names(var: str, default: str) -> list[str]:
    return [b.strip() for b in os.environ.get(var, default).split(",") if b.strip()]


_reason: list[str | None] = []


def _unavailable() -> str | None:
    if not _reason:

        async def probe() -> None:
            async with AsyncKernel(backend=DockerBackend()) as k:
                assert (await k.execute("1")).ok

        try:
            asyncio.run(probe())
            _reason.append(None)
        except SandboxUnavailableError as exc:
            _reason.append(str(exc))
    return _reason[0]


@pytest.fixture(autouse=True, scope="module")
def _docker_available() -> None:
    if "docker" not in _names("SUNROOM_TEST_BACKENDS", "subprocess,bwrap,docker"):
        pytest.skip("docker is not among SUNROOM_TEST_BACKENDS")
    reason = _unavailable()
    if reason is not None:
        if "docker" in _names("SUNROOM_REQUIRE_BACKENDS", ""):
            pytest.fail(f"required backend 'docker' is unavailable: {reason}")
        pytest.skip(f"docker unavailable here: {reason}")


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    c = docker.DockerClient.from_env()
    try:
        yield c
    finally:
        c.close()


LIMITS = Limits(memory_mb=384, pids=96, cpu_quota=0.5, disk_mb=48, timeout_s=20)


@pytest.fixture
async def kernel() -> AsyncIterator[AsyncKernel]:
    async with AsyncKernel(backend=DockerBackend(), limits=LIMITS) as k:
        yield k


def _handle(k: AsyncKernel) -> DockerKernelProcess:
    proc = k.process
    assert isinstance(proc, DockerKernelProcess)
    return proc


async def _value(k: AsyncKernel, code: str) -> Any:
    r = await k.execute(code)
    assert r.ok, r.error
    assert r.value is not None
    return ast.literal_eval(r.value)


async def test_container_flags_are_really_set(
    kernel: AsyncKernel, client: docker.DockerClient
) -> None:
    info = client.api.inspect_container(_handle(kernel).container_id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert host["Privileged"] is False
    assert "no-new-privileges" in host["SecurityOpt"]
    assert any(o.startswith("seccomp=") and "SCMP_ACT_ERRNO" in o for o in host["SecurityOpt"])
    assert host["Memory"] == 384 * 2**20
    assert host["MemorySwap"] == 384 * 2**20
    assert host["PidsLimit"] == 96
    assert host["NanoCpus"] == 500_000_000
    assert not host.get("Init")
    assert host["AutoRemove"] is False
    assert host["Tmpfs"]["/work"].split(",")[:4] == ["rw", "exec", "nosuid", "nodev"]
    assert "size=48m" in host["Tmpfs"]["/work"] and "mode=0700" in host["Tmpfs"]["/work"]
    assert "size=64m" in host["Tmpfs"]["/tmp"]
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}}
    ident = _handle(kernel).identity
    assert info["Config"]["User"] == f"{ident.uid}:{ident.gid}"
    assert ident.uid in uid_range() and ident.uid == ident.gid
    assert info["Config"]["WorkingDir"] == "/work"
    assert all(m["RW"] is False for m in info["Mounts"])
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert "SUNROOM_CANARY" not in str(env) and env["HOME"] == "/work"
    assert not any(k.startswith(("VIRTUAL_ENV", "PYENV", "DOCKER")) for k in env)


async def test_inside_the_container(kernel: AsyncKernel) -> None:
    seen = await _value(
        kernel,
        "import os, errno\n"
        "st = os.stat('/work'); vfs = os.statvfs('/work')\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "def write(p):\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        return 'WROTE'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        "(os.getuid(), os.getgid(), oct(st.st_mode & 0o777), st.st_uid,\n"
        " vfs.f_blocks * vfs.f_frsize // 2**20, sorted(os.listdir('/sys/class/net')),\n"
        " status['CapEff'].strip(), status['NoNewPrivs'].strip(), status['Seccomp'].strip(),\n"
        " [write(p) for p in ('/opt/x', '/etc/x', '/usr/x', '/opt/sunroom/lib/sunroom/x')],\n"
        " write('/work/ok'), write('/tmp/ok'),\n"
        " os.path.exists('/opt/sunroom/lib/pyproject.toml'), os.path.exists('/work/main'))",
    )
    uid, gid, mode, owner, size_mb, nics, cap_eff, nnp, seccomp, denied, work, tmp, *rest = seen
    ident = _handle(kernel).identity
    assert (uid, gid) == (ident.uid, ident.gid) and uid in uid_range()
    assert mode == "0o700" and owner == uid
    assert size_mb == 48
    assert nics == ["lo"]
    assert cap_eff == "0000000000000000" and nnp == "1" and seccomp == "2"
    assert all(d in ("EROFS", "EACCES") for d in denied), denied
    assert (work, tmp) == ("WROTE", "WROTE")
    assert rest == [False, False]  # only the package is mounted, not the checkout


async def test_workdir_size_cap_holds(kernel: AsyncKernel) -> None:
    r = await kernel.execute(
        "chunk = b'x' * 2**20\n"
        "with open('/work/fill', 'wb') as f:\n"
        "    for _ in range(100):\n"
        "        f.write(chunk)\n"
    )
    assert r.status == "error" and r.error is not None
    assert "No space left" in r.error.message
    assert (await kernel.execute("import os; os.remove('/work/fill'); 'ok'")).value == "'ok'"


async def test_labels_and_removal_after_close(client: docker.DockerClient) -> None:
    async with AsyncKernel(backend=DockerBackend(), limits=LIMITS) as k:
        await k.execute("1")
        handle = _handle(k)
        labels = client.api.inspect_container(handle.container_id)["Config"]["Labels"]
        assert labels[LABEL_KERNEL] == "1"
        assert labels[LABEL_OWNER_PID] == str(os.getpid())
        assert labels[LABEL_OWNER_STARTED] == f"{psutil.Process().create_time():.2f}"
        assert labels[LABEL_HOST] == socket.gethostname()
        supervisor = psutil.Process(handle.pid)
        assert supervisor.uids().real == handle.identity.uid != 0
        assert handle.alive()
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(handle.container_id)
    assert not handle.alive()
    uid = handle.identity.uid
    assert not psutil.pid_exists(handle.pid) or psutil.Process(handle.pid).uids().real != uid
    await handle.kill()  # idempotent, and fine for a container already gone


async def test_socket_is_unlinked_and_its_directory_private(kernel: AsyncKernel) -> None:
    seen = await _value(
        kernel,
        "import os, socket\n"
        f"st = os.stat({RUN_DIR!r})\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect({RUN_DIR!r} + '/kernel.sock')\n"
        "    c = 'CONNECTED'\n"
        "except OSError as e:\n"
        "    c = type(e).__name__\n"
        f"(oct(st.st_mode & 0o777), st.st_uid, os.listdir({RUN_DIR!r}), c)",
    )
    assert seen == ("0o700", _handle(kernel).identity.uid, [], "FileNotFoundError")


async def test_host_side_socket_dir_is_root_only_until_removed(
    kernel: AsyncKernel, client: docker.DockerClient
) -> None:
    info = client.api.inspect_container(_handle(kernel).container_id)
    (source,) = [m["Source"] for m in info["Mounts"] if m["Destination"] == RUN_DIR]
    assert _gone(source)  # unlinked right after the one accepted connection
    assert _gone(os.path.dirname(source))
    backend = DockerBackend()
    ident = Identity(2_000_000_123, 2_000_000_123)
    parent, sockdir, listener = backend._make_socket(ident)
    try:
        p, d, s = os.stat(parent), os.stat(sockdir), os.stat(sockdir / "kernel.sock")
        assert stat.S_IMODE(p.st_mode) == 0o700 and p.st_uid == os.geteuid()
        assert stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == ident.uid
        assert stat.S_ISSOCK(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o600
        assert s.st_uid == ident.uid
    finally:
        listener.close()
        shutil.rmtree(parent)


def _gone(path: str) -> bool:
    return not os.path.exists(path)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


HOST = textwrap.dedent(
    """
    import asyncio, sys
    from sunroom import AsyncKernel
    from sunroom.sandbox.backends.docker import DockerBackend

    async def main():
        async with AsyncKernel(backend=DockerBackend()) as k:
            assert (await k.execute("1")).ok

    asyncio.run(main())
    """
)


def test_stale_containers_of_a_crashed_host_are_swept(client: docker.DockerClient) -> None:
    def make(owner_pid: int, started: str, host: str) -> str:
        labels = {
            LABEL_KERNEL: "1",
            LABEL_OWNER_PID: str(owner_pid),
            LABEL_OWNER_STARTED: started,
            LABEL_HOST: host,
        }
        cid: str = client.api.create_container(
            "sunroom-kernel:offline", ["/usr/bin/false"], labels=labels, user="1000:1000"
        )["Id"]
        return cid

    me = psutil.Process()
    mine = f"{me.create_time():.2f}"
    crashed = make(_dead_pid(), "12345.00", socket.gethostname())
    reused = make(os.getpid(), "12345.00", socket.gethostname())  # a pid reused since
    alive = make(os.getpid(), mine, socket.gethostname())
    elsewhere = make(_dead_pid(), "12345.00", "another-host")
    try:
        run = subprocess.run(
            [sys.executable, "-c", HOST], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        left = {c["Id"] for c in client.api.containers(all=True)}
        assert crashed not in left and reused not in left
        assert alive in left and elsewhere in left
    finally:
        for cid in (crashed, reused, alive, elsewhere):
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(cid, force=True)


BUSY_HOST = textwrap.dedent(
    """
    import asyncio
    from sunroom import AsyncKernel
    from sunroom.sandbox.backends.docker import DockerBackend

    async def main():
        k = AsyncKernel(backend=DockerBackend())
        await k.start()
        print(k.process.container_id, k.process.pid, k.process.identity.uid, flush=True)
        await k.execute("import time\\nwhile True:\\n    time.sleep(0.1)", timeout_s=1000)

    asyncio.run(main())
    """
)


def test_kill_9_of_a_host_with_a_busy_kernel_removes_its_container(
    client: docker.DockerClient,
) -> None:
    host = subprocess.Popen([sys.executable, "-c", BUSY_HOST], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        cid, pid, uid = host.stdout.readline().split()
        assert client.api.inspect_container(cid)["State"]["Running"]
        host.kill()
        host.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.api.inspect_container(cid)
            except docker.errors.NotFound:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the container of a killed host outlived it by 10 s")
        gone = not psutil.pid_exists(int(pid))
        assert gone or psutil.Process(int(pid)).uids().real != int(uid)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        if host.stdout is not None:
            host.stdout.close()


async def test_runtime_passes_through(client: docker.DockerClient) -> None:
    async with AsyncKernel(backend=DockerBackend(runtime="runc")) as k:
        assert (await k.execute("1")).ok
        info = client.api.inspect_container(_handle(k).container_id)
        assert info["HostConfig"]["Runtime"] == "runc"


async def test_unknown_runtime_fails_closed() -> None:
    k = AsyncKernel(backend=DockerBackend(runtime="sunroom-no-such-runtime"))
    with pytest.raises(SandboxUnavailableError, match="no runtime 'sunroom-no-such-runtime'"):
        await k.start()
    await k.aclose()


async def test_failed_start_is_reported_and_leaves_no_container(
    client: docker.DockerClient,
) -> None:
    def mine() -> set[str]:
        found = client.api.containers(
            all=True, filters={"label": f"{LABEL_OWNER_PID}={os.getpid()}"}
        )
        return {c["Id"] for c in found}

    before = mine()
    # host_mounts=False expects a production image: the offline one has no Python of its own
    k = AsyncKernel(backend=DockerBackend(host_mounts=False))
    with pytest.raises(sunroom.KernelStartError, match="/usr/local/bin/python3"):
        await k.start()
    await k.aclose()
    assert mine() <= before


async def test_missing_image_fails_closed() -> None:
    k = AsyncKernel(backend=DockerBackend(image="sunroom-kernel:absent"))
    with pytest.raises(SandboxUnavailableError, match="sunroom-kernel:absent"):
        await k.start()
    await k.aclose()


async def test_unreachable_daemon_fails_closed(tmp_path: Any) -> None:
    c = docker.DockerClient(base_url=f"unix://{tmp_path}/no-daemon.sock", version="1.41")
    try:
        k = AsyncKernel(backend=DockerBackend(client=c))
        with pytest.raises(SandboxUnavailableError, match="cannot be reached"):
            await k.start()
        await k.aclose()
    finally:
        c.close()
        # docker-py leaks the socket of a failed connect (UnixHTTPConnection.connect)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


async def test_no_daemon_fails_closed_without_leaking_a_socket(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    gc.collect()  # an earlier test's garbage is not this start's: collected outside the check
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        k = AsyncKernel(backend=DockerBackend())
        with pytest.raises(SandboxUnavailableError, match="no Docker daemon answers"):
            await k.start()
        await k.aclose()
        gc.collect()  # a leaked socket would warn (an error here) when collected


def test_missing_sdk_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # what `import docker` sees when absent
    with pytest.raises(SandboxUnavailableError, match="pip install"):
        asyncio.run(DockerBackend().launch(LaunchSpec(limits=Limits(), nonce="0" * 32)))


def test_root_user_is_refused() -> None:
    with pytest.raises(UsageError):
        DockerBackend(user="0:0")
    with pytest.raises(UsageError):
        DockerBackend(user="sunroom")


async def test_out_of_memory_is_reported_with_its_limit() -> None:
    limits = Limits(memory_mb=64, address_space_slack_mb=4096)  # the cgroup, not RLIMIT_AS
    async with AsyncKernel(backend=DockerBackend(), limits=limits) as k:
        r = await k.execute("b = b'x' * (300 * 2**20)")
        assert r.status == "died" and r.error is not None
        assert "out of memory (limit 64 MB)" in r.error.message
        assert (await k.execute("1 + 1")).value == "2"


async def test_pids_limit_bounds_a_fork_bomb() -> None:
    async with AsyncKernel(backend=DockerBackend(), limits=Limits(pids=32)) as k:
        r = await k.execute(
            "import os, time\n"
            "n = 0\n"
            "try:\n"
            "    for _ in range(100):\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(30)\n"
            "            os._exit(0)\n"
            "        n += 1\n"
            "except OSError as e:\n"
            "    err = type(e).__name__\n"
            "(n < 32, err)"
        )
        assert r.ok and r.value == "(True, 'BlockingIOError')", r


def test_sync_kernel_by_name() -> None:
    with sunroom.Kernel(backend="docker") as k:
        assert k.execute("import os\nos.getcwd()").value == "'/work'"
