"""The host side of :meth:`AsyncKernel.fork`: copies of a live kernel in the same sandbox.

A kernel and its copies form a :class:`Family` that shares one sandbox (the launched process
tree: the docker container, the bwrap namespaces, the subprocess supervisor). Each member is a
kernel of its own: its own socket, its own supervisor (which reaps its descendants), its own
cgroup with the kernel's limits where the kernel has one (docker copies share the container's),
its own workdir (a copy of the parent's at fork time). Closing a member kills only its
processes; the sandbox itself is torn down with the last member, so no process of the family
can outlive all of its kernels. The kernel side is :mod:`sunroom.prelude.forking`; the
semantics are in docs/fork.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import secrets
import signal
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, final

from sunroom.errors import KernelStartError, UsageError
from sunroom.prelude.watch import children, descendants
from sunroom.rpc import schema
from sunroom.rpc.channel import Channel
from sunroom.sandbox.backend import KERNEL_SITE, KernelProcess, KernelProcessBase, Tenancy
from sunroom.sandbox.backends.bwrap import (
    FORKS_DIR,
    MASKED_PROC_DIRS,
    MASKED_PROC_FILES,
    SPARE_PROC,
    WORKDIR,
)
from sunroom.sandbox.backends.docker_process import DockerKernelProcess
from sunroom.sandbox.cgroup import Cgroup, cgroup_name
from sunroom.sandbox.fdready import readable
from sunroom.sandbox.launch import Ready, Router, check_hello
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.process import SupervisedProcess, describe_status, innermost_pid
from sunroom.sandbox.seccomp import compile_bpf
from sunroom.sandbox.watcher import watch_config

log = logging.getLogger(__name__)

MAX_COPIES: Final = 64
"""The most copies one :meth:`AsyncKernel.fork` call makes (the kernel's own cap too)."""

FORK_BACKENDS: Final = ("subprocess", "bwrap", "docker")
"""Backends whose kernels can be forked."""


@final
class Family:
    """One sandbox shared by a kernel and its copies; torn down with its last member."""

    def __init__(self, root: SupervisedProcess | DockerKernelProcess) -> None:
        self.root = root
        self.members: set[KernelProcess] = set()
        self._forks_dir: str | None = None
        self._deferred: list[Cgroup] = []

    def join(self, member: KernelProcess) -> None:
        """Count *member* in: the sandbox lives while any member does."""
        self.members.add(member)

    @property
    def cgroup(self) -> Cgroup | None:
        """The sandbox's cgroup (None for docker: copies share the container's limits)."""
        return self.root.cgroup if isinstance(self.root, SupervisedProcess) else None

    def defer(self, cgroup: Cgroup) -> None:
        """Remove *cgroup* with the sandbox (it still holds copies' supervisors)."""
        self._deferred.append(cgroup)

    async def leave(self, member: KernelProcess) -> None:
        """Count *member* out; the last one out tears the sandbox down."""
        self.members.discard(member)
        if not self.members:
            await self.root.kill()
            for cgroup in self._deferred:
                await asyncio.to_thread(cgroup.remove)
            self._deferred.clear()

    @property
    def known_forks_dir(self) -> str | None:
        """:meth:`forks_dir` once it has been made (no file system call), else None."""
        return self._forks_dir

    def forks_dir(self, backend: str) -> str:
        """The directory (as the kernel sees it) under which copies' workdirs are made."""
        if self._forks_dir is None:
            if not isinstance(self.root, SupervisedProcess) or backend == "bwrap":
                self._forks_dir = FORKS_DIR  # a tmpfs of the sandbox (bwrap, docker)
            else:
                path = self.root.rundir / "forks"
                path.mkdir(mode=0o700, exist_ok=True)
                ident = self.root.identity
                if ident is not None:
                    os.chown(path, ident.uid, ident.gid)
                self._forks_dir = str(path)
        return self._forks_dir


@final
class RootMember(KernelProcessBase):
    """The forked kernel's own handle once it has copies: closing it spares the copies."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.root = family.root
        family.join(self)
        self._closed = False
        self._runtime: int | None = None

    @property
    def workdir(self) -> Path:
        """The kernel's working directory as the host sees it."""
        return self.root.workdir

    @property
    def cgroup(self) -> Cgroup | None:
        """The kernel's cgroup (the sandbox's; None for docker, whose container has its own)."""
        return self.family.cgroup

    @property
    def kernel_pid(self) -> int | None:
        """The runtime's host pid."""
        if isinstance(self.root, SupervisedProcess):
            return self.root.kernel_pid
        if self._runtime is None and self.root.kernel_pid is not None:  # docker: map its pid
            inner = self.root.kernel_pid
            found = [p for p in descendants(self.root.pid) if innermost_pid(p) == inner]
            self._runtime = found[0] if found else None
        return self._runtime

    @property
    def host_pid(self) -> int | None:
        """The runtime's host pid (see ``KernelProcess``)."""
        return self.kernel_pid

    def adopt(self, kernel_pid: int) -> None:
        """The runtime was adopted at launch; nothing to do."""

    def interrupt(self) -> None:
        """SIGINT the runtime."""
        self.root.interrupt()

    def alive(self) -> bool:
        """Whether the kernel's runtime is still running."""
        pid = self.kernel_pid
        return not self._closed and pid is not None and _running(pid)

    async def kill(self) -> None:
        """Kill this kernel's processes (its supervisor spares the copies); idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.family.members - {self}:
                pid = self.kernel_pid
                if pid is not None:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    if isinstance(self.root, SupervisedProcess):
                        await self.root.wait_reported(3.0)
                    else:  # docker's supervisor reports through the container's end only
                        await _wait_gone(pid, 3.0)
        finally:
            await self.family.leave(self)

    async def exit_reason(self) -> str:
        """How the runtime ended (its supervisor reports it at once, copies or not)."""
        if not isinstance(self.root, SupervisedProcess) and self.family.members - {self}:
            return "the kernel's runtime ended (its container lives on for the kernel's copies)"
        return await self.root.exit_reason()

    async def log_tail(self) -> str:
        """The sandbox's early log."""
        return await self.root.log_tail()


@final
class ForkedProcess(KernelProcessBase):
    """A copy's handle: its supervisor and runtime (host pids), status pipe and cgroup.

    A *single* copy is one process in a cgroup of its own (its supervisor is its runtime): the
    forking runtime, or once that is gone the kernel's supervisor, reaps it and writes its
    status; closing it kills its cgroup (see :mod:`sunroom.prelude.forking`).
    """

    def __init__(
        self,
        family: Family,
        *,
        supervisor_pid: int,
        runtime_pid: int,
        status_fd: int,
        cgroup: Cgroup | None,
        memory_mb: int,
        single: bool = False,
    ) -> None:
        if single and cgroup is None:
            raise ValueError("a single-process copy needs a cgroup of its own")
        self.family = family
        self.single = single
        self._supervisor = supervisor_pid
        self._supervisor_fd = os.pidfd_open(supervisor_pid)
        self._runtime_fd = os.pidfd_open(runtime_pid)
        self.runtime_pid = runtime_pid
        self._status_fd = status_fd
        self._status: str | None = None
        self.cgroup = cgroup
        self._memory_mb = memory_mb
        self._oom_before = cgroup.oom_kills() if cgroup is not None else 0
        self._teardown: asyncio.Task[None] | None = None
        self.on_gone: list[Callable[[], None]] = []
        """Called once every process of the copy is gone (a template frees its uid)."""
        family.join(self)

    @property
    def workdir(self) -> Path:
        """The sandbox's workdir as the host sees it (the copy's own lives beside it)."""
        return self.family.root.workdir

    @property
    def pid(self) -> int:
        """The copy's supervisor's pid (host namespace)."""
        return self._supervisor

    @property
    def host_pid(self) -> int:
        """The copy's runtime's host pid (see ``KernelProcess``)."""
        return self.runtime_pid

    def adopt(self, kernel_pid: int) -> None:
        """The runtime was found when the copy said hello; nothing to do."""

    def interrupt(self) -> None:
        """SIGINT the copy's runtime."""
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self._runtime_fd, signal.SIGINT)

    def alive(self) -> bool:
        """Whether the copy's supervisor is still running."""
        return self._teardown is None and not _ended(self._supervisor_fd)

    async def kill(self) -> None:
        """Kill the copy's processes and leave the family; idempotent, cancellation-safe."""
        if self._teardown is None:
            self._teardown = asyncio.get_running_loop().create_task(
                self._kill_ladder(), name=f"sunroom-kill-copy-{self._supervisor}"
            )
        await asyncio.shield(self._teardown)

    async def _kill_ladder(self) -> None:
        if self.single:
            await self._kill_single()
            return
        try:
            # the runtime, not the supervisor: it then kills the copy's processes but spares
            # the copies' own copies, reports, and stays on until they are gone too
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._runtime_fd, signal.SIGKILL)
            if not await self._wait_status(3.0):
                await asyncio.to_thread(self._hard_kill)
            if self.cgroup is not None:
                if _ended(self._supervisor_fd):
                    await asyncio.to_thread(self.cgroup.remove)
                else:  # the supervisors of its copies were born in it; removed with the family
                    self.family.defer(self.cgroup)
            if self.on_gone and await _until_readable(self._supervisor_fd, 3.0):
                for callback in self.on_gone:
                    callback()
            elif self.on_gone:
                log.warning("a template's kernel outlived its kill; its uid stays out of use")
        finally:
            for fd in (self._status_fd, self._supervisor_fd, self._runtime_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            await self.family.leave(self)

    async def _kill_single(self) -> None:
        """Kill a single copy: its runtime, then whatever else its cgroup holds."""
        cgroup = self.cgroup
        assert cgroup is not None
        try:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._runtime_fd, signal.SIGKILL)
            if not await _until_readable(self._runtime_fd, 3.0):
                log.warning("a copy's runtime outlived SIGKILL for 3 s")
            await asyncio.to_thread(cgroup.remove)  # kills what else it holds, then removes it
        finally:
            for fd in (self._status_fd, self._supervisor_fd, self._runtime_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            await self.family.leave(self)

    async def _wait_status(self, within_s: float) -> bool:
        end = time.monotonic() + within_s
        while True:
            self._read_status()
            if self._status is not None:
                return True
            if not self.single and _ended(self._supervisor_fd):  # it reported, or never will
                return True
            if time.monotonic() > end:
                return False
            await asyncio.sleep(0.002)

    def _hard_kill(self) -> None:
        pids = descendants(self._supervisor)
        for pid in [self._supervisor, *pids]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def _read_status(self) -> None:
        if self._status is not None:
            return
        with contextlib.suppress(OSError):  # BlockingIOError: not yet
            os.set_blocking(self._status_fd, False)
            # b"" (every writer gone, none wrote) is an answer too: the status is unknown
            self._status = os.read(self._status_fd, 64).decode("ascii", "replace")

    async def exit_reason(self) -> str:
        """Classify the copy's death: out of memory, a signal, or an exit status."""
        await self._wait_status(5.0)
        oom = self.cgroup is not None and self.cgroup.oom_kills() > self._oom_before
        return describe_status(self._status or "", oom=oom, memory_mb=self._memory_mb)


def tenancy_of(proc: KernelProcess | None) -> Tenancy | None:
    """The tenancy of the zygote behind *proc* (None: it is not a zygote)."""
    if isinstance(proc, RootMember):
        proc = proc.root
    return proc.tenancy if isinstance(proc, SupervisedProcess) else None


def family_of(proc: KernelProcess, backend: str) -> tuple[Family, KernelProcess]:
    """The family of the kernel behind *proc*, made on its first fork; and its member handle.

    Raises UsageError for a backend whose kernels cannot be forked.
    """
    if isinstance(proc, RootMember | ForkedProcess):
        return proc.family, proc
    if backend not in FORK_BACKENDS or not isinstance(
        proc, SupervisedProcess | DockerKernelProcess
    ):
        raise UsageError(
            f"kernels of the {backend} backend cannot be forked yet; fork works on "
            f"{' and '.join(FORK_BACKENDS)} kernels"
        )
    family = Family(proc)
    return family, RootMember(family)


async def fork(
    channel: Channel,
    member: KernelProcess,
    family: Family,
    *,
    backend: str,
    n: int,
    limits: Limits,
    hello: Mapping[str, Any],
    router: Router,
    tenants: list[int | None] | None = None,
    share: int = 1,
) -> list[Ready]:
    """Fork the idle kernel on *channel* into *n* copies; return them ready.

    *hello* is the kernel's own hello: a single copy says none (its pid is in the fork's
    answer), and is given this one with its pid and nonce. *router* routes the kernel's
    notifications: it names each single copy as it forks it (``forked``), and the host moves
    it into its cgroup while the kernel forks the next.

    With *tenants* (one entry per copy; the kernel must be a zygote, see ``Tenancy``), each
    copy is a tenant of its own (:mod:`sunroom.prelude.isolation`): the entry is its uid in
    the zygote's user namespace (None: the sandbox's own uid, sunroom unprivileged), it has
    its own PID, mount, IPC, network and UTS namespaces, and its workdir is at the usual path.
    *share* is how many equal shares the zygote's per-user limits are split into (see
    ``Tenancy``). Without *tenants*, the copies share the kernel's sandbox (one trust
    domain: ``kernel.fork``).

    Raises UsageError for a bad *n* or when the kernel refuses (threads of its own), and
    KernelStartError when a copy does not come up; no copy is left running then.
    """
    if not 1 <= n <= MAX_COPIES:
        raise UsageError(f"fork makes 1 to {MAX_COPIES} copies at a time, not {n}")
    if tenants is not None and len(tenants) != n:
        raise UsageError("a tenant uid is needed for each copy")
    parent_pid = member.host_pid if isinstance(member, RootMember | ForkedProcess) else None
    if parent_pid is None:
        raise KernelStartError("the kernel's runtime is gone")
    forks_dir = family.known_forks_dir
    if forks_dir is None:
        forks_dir = await asyncio.to_thread(family.forks_dir, backend)
    # a copy with a cgroup of its own is one process: its cgroup holds whatever it starts
    single = tenants is None and family.cgroup is not None
    forking = _Forking(family, n, limits, tenants is not None, single=single, parent=parent_pid)
    # the host's ends of the copies' sockets are opened while the kernel forks (a copy's
    # hello waits in its socket until then)
    opening = asyncio.ensure_future(forking.open_channels())
    if single:
        router.on_forked = forking.forked
    try:
        copies = forking.describe(forks_dir, tenants, share)
        try:
            supervisors = await forking.ask(channel, copies)
        finally:
            router.on_forked = None
        forking.answered(supervisors)
        await opening
        forking.close_kernel_ends()
        if tenants is not None:
            await forking.admit_tenants(supervisors)
        return await forking.ready(supervisors, hello)
    except BaseException:
        if not opening.done():
            opening.cancel()
        with contextlib.suppress(BaseException):  # its failure is this one's, or moot
            await opening
        await forking.abandon()
        raise


@final
class _Forking:
    """The host's side of one fork into *n* copies, step by step, and its undoing.

    Holds what the copies are given (a socket pair, a status pipe and, for tenants, a gate
    pipe each; their cgroups, made meanwhile) until :meth:`ready` hands it to the copies'
    handles; :meth:`abandon` closes and removes whatever is still held.
    """

    def __init__(
        self, family: Family, n: int, limits: Limits, gated: bool, *, single: bool, parent: int
    ) -> None:
        self.family = family
        self.single = single
        self.parent = parent
        self.n = n
        self.limits = limits
        self.nonces = [secrets.token_hex(16) for _ in range(n)]
        self.pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(n)]
        self.pipes = [os.pipe() for _ in range(n)]
        self.gates = [os.pipe() for _ in range(n)] if gated else []
        loop = asyncio.get_running_loop()
        self.routers = [Router(loop.create_future()) for _ in range(n)]
        self.channels: list[Channel] = []
        # set by the preparing thread once made; read only once `preparing` is done
        self.cgroups: list[Cgroup | None] = [None] * n
        # what the preparing thread places (single copies): each pid the kernel names as it
        # forks it (`forked`), then the fork's answer (a list), or None once given up
        self._news: queue.SimpleQueue[int | list[int] | None] = queue.SimpleQueue()
        self._settled = False  # the answer, or the end, has been queued
        # one thread makes the copies' cgroups while the kernel forks (each mkdir and limit
        # write costs) and, for single copies, moves each into its own as soon as the kernel
        # names it: while the kernel forks the next, and with no second hop to a thread
        self.preparing = asyncio.ensure_future(asyncio.to_thread(self._prepare))
        self.call: asyncio.Future[list[int]] | None = None

    def _prepare(self) -> list[tuple[int, int]] | None:
        """In a thread: make the cgroups; place single copies as they are named (see there)."""
        self.cgroups = cgroups = _cgroups_for(self.family, self.nonces, self.limits)
        if not self.single:
            return None
        placing = _Placing(self.parent, cgroups)
        while True:
            try:
                news = self._news.get(timeout=self.limits.start_timeout_s)
            except queue.Empty:
                raise KernelStartError("the kernel did not answer the fork in time") from None
            if news is None:
                raise KernelStartError("the fork was given up")
            if isinstance(news, int):
                placing.place(news)
            else:
                return placing.finish(news)

    def forked(self, pid: int) -> None:
        """The kernel names a single copy it has just forked (its ``forked`` notification)."""
        if not self._settled:
            self._news.put(pid)

    def answered(self, pids: list[int]) -> None:
        """The kernel forked: its answer, *pids*, names every copy (the preparing thread's cue)."""
        self._settled = True
        self._news.put(pids)

    async def open_channels(self) -> None:
        """Open a channel on the host end of each copy's socket pair."""
        for host_end, copy_router in zip((p[0] for p in self.pairs), self.routers, strict=True):
            self.channels.append(
                await Channel.open(
                    host_end, on_notification=copy_router, max_frame=self.limits.max_frame_bytes
                )
            )

    def describe(
        self, forks_dir: str, tenants: list[int | None] | None, share: int
    ) -> list[dict[str, object]]:
        """What the kernel is told of each copy: its nonce, workdir, isolation and watcher.

        The watcher (``python_watch``) is for a copy with a supervisor of its own: the host's
        choice, as for a kernel (:func:`~sunroom.sandbox.watcher.watch_config`).
        """
        copies: list[dict[str, object]] = []
        watch = watch_config()
        for i, nonce in enumerate(self.nonces):
            if tenants is None:
                copy: dict[str, object] = {
                    "nonce": nonce,
                    "workdir": f"{forks_dir}/{nonce[:16]}",
                    **watch,
                }
                if self.single:
                    copy["single"] = True
                copies.append(copy)
            else:
                isolate = _isolation(tenants[i], share)
                copies.append({"nonce": nonce, "workdir": WORKDIR, "isolate": isolate, **watch})
        return copies

    async def ask(self, channel: Channel, copies: list[dict[str, object]]) -> list[int]:
        """Ask the kernel to fork, the copies' fds passed with the request; their supervisors."""
        gates = self.gates
        fds = [
            fd
            for i in range(self.n)
            for fd in (
                self.pairs[i][1].fileno(),
                self.pipes[i][1],
                *(gates[i][:1] if gates else ()),
            )
        ]
        self.call = call = channel.request(
            "fork", {"copies": copies, "fds": len(fds)}, check=schema.pids, fds=fds
        )
        return await call  # RemoteError when the kernel refused

    def close_kernel_ends(self) -> None:
        """The copies hold their ends now: close the host's copies of them."""
        for _, kernel_end in self.pairs:
            kernel_end.close()
        for i, (status_r, status_w) in enumerate(self.pipes):
            os.close(status_w)
            self.pipes[i] = (status_r, -1)

    async def admit_tenants(self, supervisors: list[int]) -> None:
        """Move each tenant's supervisor into its cgroup, then open its gate.

        A tenant's supervisor waits at its gate while it isolates itself: moved meanwhile,
        its runtime is born in its cgroup (the move costs no time).
        """
        gates = self.gates
        for i, (gate_r, gate_w) in enumerate(gates):
            os.close(gate_r)
            gates[i] = (-1, gate_w)
        await self.preparing
        hosts = await asyncio.to_thread(_supervisor_hosts, self.parent, supervisors)
        await asyncio.to_thread(_move_all, self.cgroups, hosts)
        for i, (_, gate_w) in enumerate(gates):
            os.write(gate_w, b"1")
            os.close(gate_w)
            gates[i] = (-1, -1)

    async def ready(self, supervisors: list[int], hello: Mapping[str, Any]) -> list[Ready]:
        """Wait until the copies are up and hand each what it holds, as a ready kernel.

        A single copy says no hello: the fork's answer (*supervisors*, the forking runtime's
        view of its children: the copy's own) stands for it, and its hello is the parent's
        *hello* with its pid and nonce. It is up once it is in its cgroup, moved while it
        wakes up (:meth:`answered`). A supervised copy is up once it has said hello; its
        runtime is then found and moved.
        """
        limits = self.limits
        if self.single:
            placed = await self.preparing
            assert placed is not None
            infos = [
                {**hello, "pid": own_view, "nonce": nonce}
                for (_, own_view), nonce in zip(placed, self.nonces, strict=True)
            ]
            found = [(host, host) for host, _ in placed]  # each is its own supervisor
        else:
            await _hellos(self.routers, self.channels, self.nonces, limits.start_timeout_s)
            await self.preparing
            infos = [r.hello.result() for r in self.routers]
            found = await asyncio.to_thread(
                _find_and_move,
                self.parent,
                supervisors,
                [i["pid"] for i in infos],
                self.cgroups if not self.gates else None,
            )
        runtimes = [runtime for _, runtime in found]
        ready: list[Ready] = []
        for i in range(self.n):
            proc = ForkedProcess(
                self.family,
                supervisor_pid=found[i][0],
                runtime_pid=runtimes[i],
                status_fd=self.pipes[i][0],
                cgroup=self.cgroups[i],
                memory_mb=limits.memory_mb,
                single=self.single,
            )
            self.pipes[i] = (-1, -1)
            self.cgroups[i] = None
            ready.append(Ready(proc, self.channels[i], self.routers[i], dict(infos[i])))
        return ready

    async def abandon(self) -> None:
        """Close and remove what no copy took (a closed gate turns its waiting copy away)."""
        if not self._settled:  # the preparing thread waits for it no longer
            self._settled = True
            self._news.put(None)
        call = self.call
        if call is not None and not call.cancelled():  # never left unretrieved on the channel
            if call.done():
                call.exception()
            else:
                call.cancel()
        for c in self.channels:
            await c.aclose()
        for host_end, kernel_end in self.pairs:
            host_end.close()
            kernel_end.close()
        for pipe in self.pipes + self.gates:
            for fd in pipe:
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        # its cgroups are removed once it is done with them (it may be moving a copy)
        with contextlib.suppress(BaseException):  # its failure is this one's, or moot
            await asyncio.shield(self.preparing)
        for cgroup in self.cgroups:
            if cgroup is not None:
                await asyncio.to_thread(cgroup.remove)


async def _hellos(
    routers: list[Router], channels: list[Channel], nonces: list[str], within_s: float
) -> None:
    waits = {r.hello for r in routers} | {c.closed for c in channels}
    end = loop_time() + within_s
    while not all(r.hello.done() for r in routers):
        left = end - loop_time()
        if left <= 0:
            raise KernelStartError(f"a copy did not say hello within {within_s:g} s")
        done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        for r, c in zip(routers, channels, strict=True):
            if c.closed.done() and not r.hello.done():
                raise KernelStartError("a copy ended before saying hello")
        waits -= done
    for r, nonce in zip(routers, nonces, strict=True):
        check_hello(r.hello.result(), nonce)


def loop_time() -> float:
    """The running loop's clock."""
    return asyncio.get_running_loop().time()


def _isolation(uid: int | None, share: int) -> dict[str, object]:
    """What an isolated copy needs to make itself a tenant (``isolation.isolate``'s spec)."""
    return {
        "uid": uid,
        "gid": uid,
        # unprivileged, every tenant has the user's one uid: its counts are one, not shares
        "share": share if uid is not None else 1,
        "workdir": WORKDIR,
        "forks": FORKS_DIR,
        "tmp": "/tmp",
        "site": KERNEL_SITE,
        "shm": "/dev/shm",
        "spare_proc": SPARE_PROC if uid is None else None,
        "masked_files": list(MASKED_PROC_FILES),
        "masked_dirs": list(MASKED_PROC_DIRS),
        "seccomp": compile_bpf(network=False),
    }


def _ns_pids(pid: int) -> list[int]:
    """*pid*'s pids from the host's PID namespace inward (``NSpid``); [] when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        return []
    return [pid]


@final
class _Children:
    """The forking runtime's children, by their pids in its PID namespace (host pid, own view).

    ``/proc`` is read again only for a pid not found yet, and only for children not seen yet.
    """

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self.level = len(_ns_pids(parent)) - 1  # the kernel's PID namespace, from the host's
        if self.level < 0:
            raise KernelStartError("the forking kernel's runtime is gone")
        self._by_ns: dict[int, tuple[int, int]] = {}
        self._seen: set[int] = set()

    def find(self, pid: int, what: str) -> tuple[int, int]:
        """Child *pid*'s host pid and its own view of its pid; KernelStartError naming *what*."""
        if pid not in self._by_ns:
            for kid in children(self.parent):
                if kid not in self._seen:
                    self._seen.add(kid)
                    ns = _ns_pids(kid)
                    if len(ns) > self.level:
                        self._by_ns[ns[self.level]] = (kid, ns[-1])
        found = self._by_ns.get(pid)
        if found is None:
            raise KernelStartError(f"{what} is not the forking kernel's child")
        return found


def _supervisor_hosts(parent: int, supervisors: list[int]) -> list[int]:
    """The host pids of the copies' *supervisors* (as the forking runtime *parent* sees them).

    They are its children. Raises KernelStartError when one is not among them.
    """
    kids = _Children(parent)
    return [kids.find(pid, "a copy's supervisor")[0] for pid in supervisors]


def _find_copies(
    parent: int, supervisors: list[int], hello_pids: list[int]
) -> list[tuple[int, int]]:
    """The host pids of each copy's supervisor and runtime.

    *parent* is the forking runtime's host pid; *supervisors* are the copies' supervisors as
    it sees them (its children: the fork request's answer), *hello_pids* the copies' runtimes
    as they see themselves. A copy's runtime is its supervisor's only child at hello time
    (or that child's only child, when a middle process made an isolated copy's namespace).
    Raises KernelStartError when a copy is not where it must be. (A single copy is its own
    supervisor: :class:`_Placing`.)
    """
    found: list[tuple[int, int]] = []
    hosts = _supervisor_hosts(parent, supervisors)
    for supervisor, hello_pid in zip(hosts, hello_pids, strict=True):
        runtimes = children(supervisor)
        if len(runtimes) == 1 and _ns_pids(runtimes[0])[-1:] == [1]:
            runtimes = children(runtimes[0])  # a middle process made the copy's namespace
        if len(runtimes) != 1 or _ns_pids(runtimes[0])[-1:] != [hello_pid]:
            raise KernelStartError("a copy said hello from a process outside its kernel's sandbox")
        found.append((supervisor, runtimes[0]))
    return found


@final
class _Placing:
    """Single copies moved into their cgroups as the kernel names them (in a thread).

    Each pid is the forking runtime's view, which is the copy's own (a single copy says no
    hello): only that runtime's own children can be named. A runtime that lies can only move
    its own processes between cgroups that all have its limits and go with its sandbox: one
    kernel's processes, one trust domain (``kernel.fork``). The answer is the authority: a copy
    it names that no ``forked`` did is placed then, and one named otherwise is refused.
    """

    def __init__(self, parent: int, cgroups: list[Cgroup | None]) -> None:
        self.cgroups = cgroups
        self.children = _Children(parent)
        self.named: list[int] = []
        self.placed: list[tuple[int, int]] = []  # (host pid, its own view of its pid)

    def place(self, pid: int) -> None:
        """Move copy *pid*, the next one forked, into its cgroup."""
        if len(self.named) == len(self.cgroups):
            raise KernelStartError("the kernel named more copies than it was asked for")
        host, own_view = self.children.find(pid, "a copy")
        _move_all([self.cgroups[len(self.named)]], [host])
        self.named.append(pid)
        self.placed.append((host, own_view))

    def finish(self, answer: list[int]) -> list[tuple[int, int]]:
        """Check the fork's *answer* against the copies placed, place the rest; all of them."""
        if len(answer) != len(self.cgroups) or answer[: len(self.named)] != self.named:
            raise KernelStartError("the fork's answer does not name the copies it forked")
        for pid in answer[len(self.named) :]:
            self.place(pid)
        return self.placed


def _find_and_move(
    parent: int,
    supervisors: list[int],
    hello_pids: list[int],
    cgroups: list[Cgroup | None] | None,
) -> list[tuple[int, int]]:
    """:func:`_find_copies`, then each runtime into its cgroup (unless *cgroups* is None).

    The runtimes only, back to back: a supervisor just waits, and every move is an
    RCU-synchronised migration that the next one, close behind, may share.
    """
    found = _find_copies(parent, supervisors, hello_pids)
    if cgroups is not None:
        _move_all(cgroups, [runtime for _, runtime in found])
    return found


def _cgroups_for(family: Family, nonces: list[str], limits: Limits) -> list[Cgroup | None]:
    """One cgroup per copy with the kernel's limits (Nones when the kernel has no cgroup)."""
    if family.cgroup is None:
        return [None] * len(nonces)
    made: list[Cgroup | None] = []
    try:
        for nonce in nonces:
            cgroup = Cgroup.create(
                cgroup_name(nonce),
                memory_mb=limits.memory_mb,
                pids=limits.pids,
                cpu_quota=limits.cpu_quota,
            )
            if cgroup is None:
                raise KernelStartError("could not create a copy's cgroup")
            made.append(cgroup)
    except BaseException:
        for cgroup in made:
            if cgroup is not None:
                cgroup.remove()
        raise
    return made


def _move_all(cgroups: list[Cgroup | None], pids: list[int]) -> None:
    try:
        for cgroup, pid in zip(cgroups, pids, strict=True):
            if cgroup is not None:
                cgroup.add(pid)
    except OSError as exc:
        raise KernelStartError(f"cannot move a copy into its cgroup: {exc.strerror}") from exc


def _ended(pidfd: int) -> bool:
    try:
        return readable(pidfd)
    except OSError:
        return True


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


async def _wait_gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while _running(pid):
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.005)
    return True


async def _until_readable(fd: int, within_s: float) -> bool:
    """Wait until *fd* (a pidfd: its process has ended) is readable; False after *within_s*."""
    if _ended(fd):
        return True
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, within_s)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True
