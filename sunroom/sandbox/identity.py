"""Per-kernel host identities: one unprivileged host uid/gid, reserved for sunroom, per live kernel.

A kernel process never runs as, or maps to, host uid 0. When sunroom runs as root, every kernel
(subprocess, bwrap or docker) runs as its own uid from a range reserved for sunroom (default
``2000000000``–``2000065535``; ``SUNROOM_UID_BASE`` / ``SUNROOM_UID_COUNT`` move it), with the
same number as its gid and no supplementary groups. So kernels never share per-user kernel
limits (inotify instances, message-queue bytes, queued signals, pipe buffers, keyrings) and cannot
signal or trace each other. Started by an unprivileged user, the local backends run kernels as
that user (the kernel still never maps to root); the docker backend always leases a uid.

A lease is an exclusive ``flock`` on ``<lock dir>/<uid>`` held by the host for the kernel's
lifetime, and a uid is only leased when no live process on the host has it as its real,
effective, saved or filesystem uid (a kernel left behind by a crashed host keeps its uid out of
use until it is gone). uids that name a user or group in the host's databases are skipped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import grp
import itertools
import os
import pwd
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from sunroom.errors import SandboxUnavailableError, UsageError

DEFAULT_UID_BASE: Final = 2_000_000_000
"""First uid of the reserved range (in 1879048192-2147483647, which no distribution allocates)."""

DEFAULT_UID_COUNT: Final = 65_536
"""How many uids the range holds: the most kernels one host can run at once."""

ROOT_LOCK_DIR: Final = Path("/run/sunroom/uids")
_MAX_UID: Final = 2**31 - 2


@dataclass(frozen=True, slots=True)
class Identity:
    """A host uid/gid a kernel runs as (gid equals uid for leased identities)."""

    uid: int
    gid: int


def uid_range() -> range:
    """The reserved range, from ``SUNROOM_UID_BASE`` / ``SUNROOM_UID_COUNT`` or the defaults.

    Raises UsageError when the variables are not integers or the range includes uid 0 or
    leaves the positive 32-bit signed range that every tool handles.
    """
    try:
        base = int(os.environ.get("SUNROOM_UID_BASE", DEFAULT_UID_BASE))
        count = int(os.environ.get("SUNROOM_UID_COUNT", DEFAULT_UID_COUNT))
    except ValueError:
        raise UsageError("SUNROOM_UID_BASE and SUNROOM_UID_COUNT must be integers") from None
    if base < 1000 or count < 1 or base + count - 1 > _MAX_UID:
        raise UsageError(
            f"the kernel uid range {base}+{count} must start at 1000 or above and end at or "
            f"below {_MAX_UID}"
        )
    return range(base, base + count)


def _lock_dir() -> Path:
    """Where leases are held: a root-only directory under /run as root, else a per-user one."""
    if os.geteuid() == 0:
        path = ROOT_LOCK_DIR
    else:
        path = Path(tempfile.gettempdir()) / f"sunroom-uids-{os.geteuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise SandboxUnavailableError(
            f"cannot make the kernel uid lock directory {path}: {exc.strerror}"
        ) from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise SandboxUnavailableError(
            f"the kernel uid lock directory {path} must be a directory owned by uid "
            f"{os.geteuid()} with mode 0700; remove it and retry"
        )
    return path


def _known(uid: int) -> bool:
    """Whether *uid* names a user or a group in the host's databases."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


def live_uids() -> set[int]:
    """Every uid (real, effective, saved, filesystem) of a live process on this host.

    Zombies are left out: they hold no resources and can do nothing.
    """
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        # os.open and one read, not a file object read by lines: half the cost per process
        try:
            fd = os.open(f"/proc/{name}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            head = os.read(fd, 4096)  # State and Uid are among the first dozen lines
        except OSError:
            continue
        finally:
            os.close(fd)
        state = head.find(b"\nState:\t")  # "State:\tZ (zombie)"
        if state >= 0 and head[state + 8 : state + 9] == b"Z":
            continue
        at = head.find(b"\nUid:")
        end = head.find(b"\n", at + 1)
        if at < 0 or end < 0:
            continue
        try:
            found.update(map(int, head[at + 5 : end].split()))
        except ValueError:
            continue
    return found


@final
class _SharedScans:
    """Scans of ``/proc`` (:func:`live_uids`) shared by the leases that wait for one together.

    A lease needs a scan that began after it took its lock (a process of that uid found then
    cannot be missed, and none can appear while the lock is held). Concurrent leases ask at
    about the same time: the first runs a scan, the others that asked before it began wait
    for it, and those that asked while it ran wait for the next one. With a hundred kernels
    starting at once that is a few scans instead of a hundred (each reads every process's
    ``status``: 18 ms with 384 kernels on the host, three processes each).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._begun = 0  # scans begun so far (the last one may still run)
        self._done = 0  # the number of the last scan finished
        self._running = False
        self._found: set[int] = set()

    def after_now(self) -> set[int]:
        """The uids of a scan begun after this call; raises what :func:`live_uids` raises."""
        with self._cond:
            need = self._begun + 1  # a scan running now began too early
            while self._done < need:
                if self._running:
                    self._cond.wait()
                    continue
                self._begun += 1
                mine = self._begun
                self._running = True
                self._cond.release()
                found: set[int] | None = None
                try:
                    found = live_uids()
                finally:
                    self._cond.acquire()
                    self._running = False
                    if found is not None:
                        self._done, self._found = mine, found
                    self._cond.notify_all()
            return self._found


_SCANS = _SharedScans()


@final
class _Hint:
    """Where a lease's walk of the range starts, per range: just after the last uid leased.

    Or at the lowest uid this process gave back since, if lower. The walk wraps around, so a
    uid another process gave back below the hint is still found, only later. Without it every
    lease tried the lock of every uid held below the first free one: 1,000 opens and ``flock``
    calls with 1,000 kernels held.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[tuple[int, int], int] = {}

    def order(self, uids: range) -> list[range]:
        """The range to walk, as two pieces: from the hint to the end, then the start to it."""
        with self._lock:
            start = self._next.get((uids.start, len(uids)), uids.start)
        if start not in uids:
            start = uids.start
        return [range(start, uids.stop), range(uids.start, start)]

    def leased(self, uids: range, uid: int) -> None:
        with self._lock:
            key = (uids.start, len(uids))
            if self._next.get(key, uids.start) <= uid:
                self._next[key] = uid + 1

    def released(self, uid: int) -> None:
        with self._lock:
            for (start, count), at in self._next.items():
                if start <= uid < start + count and uid < at:
                    self._next[(start, count)] = uid


_HINT = _Hint()


@final
class IdentityLease:
    """One leased identity; :meth:`release` once every process of the kernel is gone."""

    def __init__(self, identity: Identity, fd: int) -> None:
        self.identity = identity
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the uid back. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock
            _HINT.released(self.identity.uid)

    @property
    def held(self) -> bool:
        """Whether the lease is still held."""
        return self._fd is not None


def lease_identity() -> IdentityLease:
    """Lease a uid from the reserved range that no other kernel or process holds.

    Raises SandboxUnavailableError when every uid of the range is in use or the lock
    directory cannot be used, and UsageError for a malformed range.
    """
    uids = uid_range()
    lock_dir = _lock_dir()
    busy: set[int] | None = None
    for uid in itertools.chain.from_iterable(_HINT.order(uids)):
        # the lock first: it is two syscalls, while a user-database lookup reads the files
        # (uids held by other kernels, most of those tried, never reach it)
        try:
            fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SandboxUnavailableError(
                f"cannot lease a kernel uid in {lock_dir}: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue
            raise SandboxUnavailableError(
                f"cannot lease a kernel uid in {lock_dir}: {exc.strerror}"
            ) from None
        if _known(uid):
            os.close(fd)
            continue
        if busy is None:
            busy = _SCANS.after_now()
        if uid in busy:
            os.close(fd)
            continue
        _HINT.leased(uids, uid)
        return IdentityLease(Identity(uid, uid), fd)
    raise SandboxUnavailableError(
        f"all {len(uids)} kernel uids ({uids.start}-{uids.stop - 1}) are in use; close kernels "
        "or widen the range with SUNROOM_UID_COUNT"
    )


def lease_if_root() -> IdentityLease | None:
    """A lease when this process runs as root (kernels must drop to it), else None."""
    return lease_identity() if os.geteuid() == 0 else None


async def lease_if_root_off_loop() -> IdentityLease | None:
    """:func:`lease_if_root` in a worker thread, so the event loop keeps serving meanwhile.

    A lease reads ``/proc`` and the user databases (tens of ms with a hundred kernels, growing
    with their number), which must not hold the loop of a server. If the caller is cancelled,
    the lease the thread still takes is released. Raises what :func:`lease_identity` raises.
    """
    if os.geteuid() != 0:
        return None
    loop = asyncio.get_running_loop()
    leasing = asyncio.ensure_future(loop.run_in_executor(_lease_threads(), lease_identity))
    try:
        return await asyncio.shield(leasing)
    except asyncio.CancelledError:
        leasing.add_done_callback(_release_unwanted)
        raise


_THREADS: list[concurrent.futures.ThreadPoolExecutor] = []


def _lease_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The threads leases run in, made on first use: not the loop's default executor.

    A burst of leases waiting for one shared scan would hold its few threads (six on two
    cores) while the launches queue their cgroup and run-directory work behind them.
    """
    with _THREADS_LOCK:
        if not _THREADS:
            _THREADS.append(
                concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="sunroom-lease")
            )
        return _THREADS[0]


_THREADS_LOCK = threading.Lock()


def _release_unwanted(leasing: asyncio.Future[IdentityLease]) -> None:
    """Release the lease a cancelled :func:`lease_if_root_off_loop` took after all."""
    if not leasing.cancelled() and leasing.exception() is None:
        leasing.result().release()


def unreachable(paths: list[str]) -> str | None:
    """Why a process of another, unprivileged uid could not read *paths*, or None if it can.

    Every ancestor directory must be searchable by others; each path itself readable (and a
    directory also searchable) by others. Returns one sentence naming the first obstacle.
    """
    for raw in paths:
        path = os.path.realpath(raw)
        parts = Path(path).parts
        for i in range(1, len(parts)):
            parent = os.path.join(*parts[:i])
            with contextlib.suppress(OSError):
                if not os.stat(parent).st_mode & stat.S_IXOTH:
                    return f"{parent} is not searchable by other users (needed for {path})"
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            return f"{path} cannot be read: {exc.strerror}"
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            return f"{path} is not readable by other users"
    return None


def require_reachable(paths: list[str], backend: str) -> None:
    """Fail closed when a kernel running as a leased uid could not read *paths*."""
    reason = unreachable(paths)
    if reason is not None:
        raise SandboxUnavailableError(
            f"sunroom runs as root, so each {backend} kernel runs as its own unprivileged uid, "
            f"and {reason}; install Python and sunroom where other users can read them (e.g. a "
            "virtualenv made from /usr/bin/python3 outside /root), or run sunroom as a "
            "non-root user"
        )


@final
class BlockLease:
    """Consecutive leased uids: the tenants of one isolating zygote (a bwrap template).

    Each uid is held like a single :class:`IdentityLease` (an exclusive ``flock``), so no
    other kernel of any sunroom process on the host takes one while the block is held.
    """

    def __init__(self, leases: list[IdentityLease]) -> None:
        self._leases = leases
        self.first = leases[0].identity.uid
        self.count = len(leases)

    def release(self) -> None:
        """Give every uid back. Idempotent."""
        for lease in self._leases:
            lease.release()

    async def aclose(self) -> None:
        """:meth:`release`, as a kernel companion (released with the zygote's sandbox)."""
        self.release()


def lease_block(count: int) -> BlockLease:
    """Lease *count* consecutive uids of the reserved range that no kernel or process holds.

    Raises SandboxUnavailableError when the range has no such run of free uids (or the lock
    directory cannot be used), UsageError for a malformed range or a *count* below 1.
    """
    if count < 1:
        raise UsageError(f"a block of kernel uids holds at least one uid, not {count}")
    uids = uid_range()
    lock_dir = _lock_dir()
    busy = live_uids()
    held: list[IdentityLease] = []
    for uid in uids:
        free = not _known(uid) and uid not in busy
        fd = -1
        if free:
            try:
                fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                for lease in held:
                    lease.release()
                raise SandboxUnavailableError(
                    f"cannot lease a kernel uid in {lock_dir}: {exc.strerror}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                free = False
        if not free:
            for lease in held:  # the run is broken: start a new one after this uid
                lease.release()
            held = []
            continue
        held.append(IdentityLease(Identity(uid, uid), fd))
        if len(held) == count:
            return BlockLease(held)
    for lease in held:
        lease.release()
    raise SandboxUnavailableError(
        f"the kernel uid range ({uids.start}-{uids.stop - 1}) has no {count} consecutive free "
        "uids for a template's kernels; close kernels, widen the range with SUNROOM_UID_COUNT "
        "or lower Template(max_kernels=)"
    )
