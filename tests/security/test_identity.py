"""Kernels never run as, or map to, host root; each has its own uid; /proc is masked.

These run as root in CI (the case that used to be a host-root escape): a bwrap kernel's
sandbox user mapped to host uid 0, could write global ``/proc/sys`` settings (``core_pattern``
runs a command as host root) and shared root's per-user limits with every other kernel and
with the host itself.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import platform
import secrets
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator

import psutil
import pytest

from sunroom import AsyncKernel, Limits
from sunroom.errors import SandboxUnavailableError
from sunroom.sandbox import identity
from sunroom.sandbox.identity import lease_identity, live_uids, uid_range

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="per-kernel uids need a root host")

LIMITS = Limits(timeout_s=20, memory_mb=256, pids=64, disk_mb=32)


async def run(k: AsyncKernel, code: str) -> object:
    r = await k.execute(code, timeout_s=20)
    assert r.ok, (r.error, r.stdout, r.stderr)
    return r.value


def host_uids(k: AsyncKernel) -> set[int]:
    """Every uid (real/effective/saved/fs) of every process of the kernel, read on the host."""
    proc = k.process
    assert proc is not None
    top = psutil.Process(proc.pid)  # type: ignore[attr-defined]
    uids: set[int] = set()
    for p in [top, *top.children(recursive=True)]:
        with open(f"/proc/{p.pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uids.update(int(x) for x in line.split()[1:])
    return uids


@pytest.fixture
async def pair(backend: str) -> AsyncIterator[tuple[AsyncKernel, AsyncKernel]]:
    async with (
        AsyncKernel(backend=backend, limits=LIMITS) as a,
        AsyncKernel(backend=backend, limits=LIMITS) as b,
    ):
        yield a, b


@pytest.fixture
async def jail_pair(isolated_backend: str) -> AsyncIterator[tuple[AsyncKernel, AsyncKernel]]:
    async with (
        AsyncKernel(backend=isolated_backend, limits=LIMITS) as a,
        AsyncKernel(backend=isolated_backend, limits=LIMITS) as b,
    ):
        yield a, b


async def test_each_kernel_has_its_own_unprivileged_host_uid(
    pair: tuple[AsyncKernel, AsyncKernel],
) -> None:
    a, b = pair
    ua, ub = host_uids(a), host_uids(b)
    assert 0 not in ua and 0 not in ub, (ua, ub)
    if os.geteuid() == 0:
        assert len(ua) == 1 and len(ub) == 1, (ua, ub)
        assert ua != ub
        assert ua | ub <= set(uid_range())
    # control: the kernels work
    assert await run(a, "6 * 7") == "42"


def _map(text: str) -> list[int]:
    return [int(field) for field in text.split()]


@root_only
async def test_uid_map_inside_the_sandbox_and_from_the_host() -> None:
    # docs/security.md, "Who a kernel runs as": bubblewrap sets the sandbox up as uid 0 of a
    # first namespace (mapped to the leased uid), then runs the kernel in a second one nested
    # in it (uid 1000 there is uid 0 of the first). A uid_map is read relative to the reader:
    # inside, relative to the parent namespace ("1000 0 1"); from the host, relative to the
    # host's ("1000 <leased uid> 1"). Either way uid 1000 is the leased uid, never host root.
    async with AsyncKernel(backend="bwrap", limits=LIMITS) as k:
        r = await k.execute(
            "import os\n"
            "print(open('/proc/self/uid_map').read() + open('/proc/self/gid_map').read())\n"
            "(os.getuid(), os.getgid())",
            timeout_s=20,
        )
        assert r.ok, r
        assert r.value == "(1000, 1000)"
        inside_uid, inside_gid = r.stdout.strip().splitlines()
        assert _map(inside_uid) == [1000, 0, 1]
        assert _map(inside_gid) == [1000, 0, 1]
        host_pid = getattr(k.process, "host_pid", None)  # the runtime, seen from the host
        assert isinstance(host_pid, int)
        [leased] = host_uids(k)
        assert leased in uid_range()
        uid_map, gid_map, ids = _host_view(host_pid)
        assert _map(uid_map) == [1000, leased, 1]
        assert _map(gid_map) == [1000, leased, 1]
        assert ids == [[str(leased)] * 4, [str(leased)] * 4]  # Uid: and Gid:, all four


def _host_view(pid: int) -> tuple[str, str, list[list[str]]]:
    """The uid_map, gid_map and Uid:/Gid: lines of *pid*, read in the host's namespace."""
    with open(f"/proc/{pid}/uid_map") as f:
        uid_map = f.read()
    with open(f"/proc/{pid}/gid_map") as f:
        gid_map = f.read()
    with open(f"/proc/{pid}/status") as f:
        ids = [line.split()[1:] for line in f if line.startswith(("Uid:", "Gid:"))]
    return uid_map, gid_map, ids


SYSCTLS = (
    "kernel/core_pattern",
    "kernel/panic",
    "vm/overcommit_memory",
    "kernel/sysrq",
    "net/ipv4/ip_forward",
)

WRITE_BACK = r"""
import json
res = {}
for name in NAMES:
    p = '/proc/sys/' + name
    try:
        value = open(p).read()
    except OSError as e:
        res[name] = 'unreadable: ' + type(e).__name__
        continue
    try:
        with open(p, 'w') as f:
            f.write(value)
        res[name] = 'WRITTEN'
    except OSError as e:
        res[name] = type(e).__name__
json.dumps(res)
"""


async def test_proc_sys_cannot_be_written(jail_pair: tuple[AsyncKernel, AsyncKernel]) -> None:
    a, _ = jail_pair
    out = await run(a, f"NAMES = {list(SYSCTLS)!r}\n" + WRITE_BACK)
    assert isinstance(out, str)
    assert "WRITTEN" not in out, out
    # control: the values were readable, so each write really was attempted
    assert "unreadable" not in out.split('"kernel/core_pattern"')[1].split(",")[0], out


def _keyring_syscalls() -> tuple[int, int] | None:
    return {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine())


@pytest.fixture
def host_key() -> Iterator[str]:
    """A key with a unique description in the host user's keyring (removed afterwards)."""
    nums = _keyring_syscalls()
    if nums is None:
        pytest.skip(f"no keyring syscall numbers for {platform.machine()}")
    add_key, keyctl = nums
    libc = ctypes.CDLL(None, use_errno=True)
    name = f"sunroom-canary-{secrets.token_hex(6)}"
    payload = b"secret"
    key = libc.syscall(
        add_key, b"user", name.encode(), payload, len(payload), ctypes.c_int(-4)
    )  # KEY_SPEC_USER_KEYRING
    if key < 0:
        pytest.skip(f"cannot add a key here: {os.strerror(ctypes.get_errno())}")
    with open("/proc/keys") as f:
        assert name in f.read()  # the host itself sees it
    try:
        yield name
    finally:
        libc.syscall(keyctl, 3, ctypes.c_int(key))  # KEYCTL_REVOKE


async def test_host_keys_are_invisible(
    jail_pair: tuple[AsyncKernel, AsyncKernel], host_key: str
) -> None:
    a, _ = jail_pair
    out = await run(
        a,
        "res = []\n"
        "for p in ('/proc/keys', '/proc/key-users'):\n"
        "    try:\n"
        "        res.append(open(p).read())\n"
        "    except OSError as e:\n"
        "        res.append(type(e).__name__)\n"
        "repr(res)",
    )
    assert isinstance(out, str)
    assert host_key not in out
    assert "sunroom-canary" not in out


def _host_file(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


async def test_host_details_are_masked(
    jail_pair: tuple[AsyncKernel, AsyncKernel], isolated_backend: str
) -> None:
    a, _ = jail_pair
    cmdline = _host_file("/proc/cmdline")
    boot_id = _host_file("/proc/sys/kernel/random/boot_id")
    out = await run(
        a,
        "import json\n"
        "res = {}\n"
        "for p in ('/proc/cmdline', '/proc/sys/kernel/random/boot_id', '/etc/resolv.conf',\n"
        "          '/proc/kcore', '/proc/timer_list', '/proc/sysrq-trigger'):\n"
        "    try:\n"
        "        res[p] = open(p, 'rb').read(4096).decode('latin-1')\n"
        "    except OSError as e:\n"
        "        res[p] = type(e).__name__\n"
        "json.dumps(res)",
    )
    assert isinstance(out, str)
    assert "nameserver" not in out
    assert 'timer_list": ""' in out or 'timer_list": "FileNotFoundError' in out
    if isolated_backend == "bwrap":
        # runc refuses mounts inside /proc: on docker these stay visible (docs/security.md)
        assert boot_id not in out
        if cmdline:
            assert cmdline not in out


EXHAUST = r"""
import ctypes, errno, fcntl, os, signal, threading
libc = ctypes.CDLL(None, use_errno=True)
librt = ctypes.CDLL('librt.so.1', use_errno=True)
HELD = []
class MqAttr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long),
                ('msgsize', ctypes.c_long), ('curmsgs', ctypes.c_long),
                ('pad', ctypes.c_long * 4)]
librt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(MqAttr)]

def inotify(count):
    for i in range(count):
        fd = libc.inotify_init1(0)
        if fd < 0:
            return errno.errorcode[ctypes.get_errno()], i
        HELD.append(fd)
    return 'ok', count

def mqueue(count):
    attr = MqAttr(0, 10, 8192, 0)
    for i in range(count):
        name = ('/sunroom-%d-%d' % (os.getpid(), len(HELD))).encode()
        fd = librt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
        if fd < 0:
            return errno.errorcode[ctypes.get_errno()], i
        librt.mq_unlink(name)
        HELD.append(fd)
    return 'ok', count

def rtsignals(count):
    sig = signal.SIGRTMIN + 1
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    me = threading.get_ident()
    for i in range(count):
        try:
            signal.pthread_kill(me, sig)
        except OSError as e:
            return errno.errorcode[e.errno], i
    return 'ok', count

def pipes(count):
    for i in range(count):
        r, w = os.pipe()
        HELD.extend((r, w))
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError as e:
            return errno.errorcode[e.errno], i
    return 'ok', count
"""

LIMIT_CHECKS = {
    # what to exhaust in one kernel, and how many tries that takes at most (the per-user limit)
    "inotify": 1000,
    "mqueue": 200,
    "rtsignals": 200_000,
    "pipes": 200,
}


async def test_per_user_limits_are_per_kernel(
    jail_pair: tuple[AsyncKernel, AsyncKernel],
) -> None:
    a, b = jail_pair
    await run(a, EXHAUST)
    await run(b, EXHAUST)
    for check, tries in LIMIT_CHECKS.items():
        outcome = await run(a, f"{check}({tries})")
        assert isinstance(outcome, str)
        assert not outcome.startswith("('ok'"), f"{check} was never exhausted: {outcome}"
        # the other kernel is unaffected...
        assert await run(b, f"{check}(1)") == "('ok', 1)", check
    # ...and so is the host
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    os.close(fd)
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    finally:
        os.close(r)
        os.close(w)


@root_only
def test_a_uid_in_use_by_a_live_process_is_never_leased() -> None:
    first = uid_range().start
    taken = lease_identity()
    squatter = None
    try:
        # a process (say, a kernel left behind by a crashed host) runs as the next free uid
        nxt = taken.identity.uid + 1
        squatter = subprocess.Popen(["sleep", "30"], user=nxt, group=nxt, extra_groups=[])
        assert nxt in live_uids()
        lease = lease_identity()
        try:
            assert lease.identity.uid not in (taken.identity.uid, nxt)
            assert lease.identity.uid >= first
        finally:
            lease.release()
    finally:
        taken.release()
        if squatter is not None:
            squatter.kill()
            squatter.wait()


@root_only
async def test_no_free_uid_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    base = uid_range().start + 40_000 + secrets.randbelow(20_000)
    monkeypatch.setenv("SUNROOM_UID_BASE", str(base))
    monkeypatch.setenv("SUNROOM_UID_COUNT", "1")
    async with AsyncKernel(backend="subprocess", limits=LIMITS) as k:
        assert host_uids(k) == {base}
        with pytest.raises(SandboxUnavailableError, match="kernel uids .* are in use"):
            async with AsyncKernel(backend="subprocess", limits=LIMITS):
                pass
    # released with the kernel: the uid can be leased again
    lease = lease_identity()
    assert lease.identity.uid == base
    lease.release()


@root_only
def test_unreadable_interpreter_is_refused_with_a_fix(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from sunroom.sandbox.identity import require_reachable

    hidden = tmp_path_factory.mktemp("hidden")
    os.chmod(hidden, 0o700)
    with pytest.raises(SandboxUnavailableError, match="not searchable by other users"):
        require_reachable([str(hidden / "python")], "bwrap")


@root_only
async def test_a_lease_is_taken_off_the_loop_and_a_cancelled_one_is_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = uid_range().start + 40_000 + secrets.randbelow(20_000)
    monkeypatch.setenv("SUNROOM_UID_BASE", str(base))
    monkeypatch.setenv("SUNROOM_UID_COUNT", "1")
    started = threading.Event()
    real = identity.live_uids

    def slow_live_uids() -> set[int]:  # the /proc scan, made slow enough to cancel during
        started.set()
        time.sleep(0.3)
        return real()

    monkeypatch.setattr(identity, "live_uids", slow_live_uids)
    leasing = asyncio.create_task(identity.lease_if_root_off_loop())
    ticks = 0
    assert await asyncio.to_thread(started.wait, 10)  # the thread scans /proc now
    while not leasing.done() and ticks < 5:  # meanwhile the loop keeps running
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 5 and not leasing.done()
    leasing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leasing
    monkeypatch.setattr(identity, "live_uids", real)
    deadline = time.monotonic() + 10
    while True:  # the thread's lease of the only uid is released once it is taken
        try:
            lease = lease_identity()
            break
        except SandboxUnavailableError:
            assert time.monotonic() < deadline, "the cancelled lease was never released"
            await asyncio.sleep(0.05)
    assert lease.identity.uid == base
    lease.release()


@root_only
def test_a_uid_that_names_a_user_or_group_is_never_leased(monkeypatch: pytest.MonkeyPatch) -> None:
    """65534 is ``nobody`` (and ``nogroup``) on Debian: the range 65534-65535 leases 65535 only.

    The user databases are read only for a uid whose lock was free (the lookup costs far more
    than the lock: issue 31's density baseline); a known uid's lock is let go at once.
    """
    import pwd

    try:
        pwd.getpwuid(65534)
    except KeyError:
        pytest.skip("no user 65534 on this host")
    monkeypatch.setenv("SUNROOM_UID_BASE", "65534")
    monkeypatch.setenv("SUNROOM_UID_COUNT", "2")
    lease = lease_identity()
    try:
        assert lease.identity.uid == 65535
        with pytest.raises(SandboxUnavailableError, match="are in use"):
            lease_identity()
        fd = os.open(identity.ROOT_LOCK_DIR / "65534", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # not held by the skipped lease
        finally:
            os.close(fd)
    finally:
        lease.release()
