"""A supervised kernel process started on this host (used by the subprocess and bwrap backends).

Owns the supervisor process, its status pipe, the kernel's cgroup and its private directory.
:meth:`SupervisedProcess.kill` tears everything down: SIGTERM to the supervisor (which kills and
reaps every descendant), then SIGKILL of anything left (found through the cgroup and the process
tree), then the directory is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any, Final, Protocol, final

from sunroom.errors import KernelStartError, SandboxUnavailableError
from sunroom.prelude.watch import children, descendants
from sunroom.sandbox import child
from sunroom.sandbox.backend import IPC_TOKEN, PYTHON_TOKEN, ExecSpec, KernelProcessBase, Tenancy
from sunroom.sandbox.cgroup import Cgroup, cgroup_name, sweep_orphans_once
from sunroom.sandbox.fdready import readable
from sunroom.sandbox.identity import Identity, IdentityLease
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.rundirs import make_rundir, remove_tree
from sunroom.sandbox.watcher import compiled_launcher, watch_config

log = logging.getLogger(__name__)

_SIGNAL_NAMES = {s.value: s.name for s in signal.Signals}


@final
class SupervisedProcess(KernelProcessBase):
    """Handle on one supervisor process tree; implements ``KernelProcess``."""

    def __init__(
        self,
        proc: child.Child,
        *,
        status_fd: int,
        rundir: Path,
        workdir: Path,
        cgroup: Cgroup | None,
        memory_mb: int,
        stop_signal: signal.Signals = signal.SIGTERM,
        stop_inner: bool = False,
        lease: IdentityLease | None = None,
    ) -> None:
        self._proc = proc
        self._lease = lease
        self._status_fd = status_fd
        self._rundir = rundir
        self._workdir = workdir
        self._cgroup = cgroup
        self._memory_mb = memory_mb
        self._stop_signal = stop_signal
        self._stop_inner = stop_inner
        self._oom_before = cgroup.oom_kills() if cgroup else 0
        self._kernel_pid: int | None = None
        self._status: str | None = None
        self._teardown: asyncio.Task[None] | None = None
        self.ipc_dir: Path | None = None
        """A foreign kernel program's IPC directory as the host sees it (``ExecSpec``)."""
        self.companions: list[Companion] = []
        """Host resources that live as long as the sandbox (its egress proxy), closed once the
        tree is dead."""
        self.tenancy: Tenancy | None = None
        """Set on a zygote (``LaunchSpec.tenants``): how its isolated copies are made."""

    @property
    def pid(self) -> int:
        """The supervisor's pid (host namespace)."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The supervisor's exit code once the event loop reaped it (None before).

        0 after a clean teardown, whatever the kernel's own end (that is :meth:`exit_reason`).
        """
        return self._proc.returncode

    @property
    def kernel_pid(self) -> int | None:
        """The runtime's host pid, once :meth:`adopt` found it."""
        return self._kernel_pid

    @property
    def host_pid(self) -> int | None:
        """The runtime's host pid, once :meth:`adopt` found it (see ``KernelProcess``)."""
        return self._kernel_pid

    @property
    def workdir(self) -> Path:
        """The kernel's working directory."""
        return self._workdir

    @property
    def rundir(self) -> Path:
        """The kernel's private run directory on the host (removed by :meth:`kill`)."""
        return self._rundir

    @property
    def cgroup(self) -> Cgroup | None:
        """The kernel's cgroup, when one could be created."""
        return self._cgroup

    @property
    def identity(self) -> Identity | None:
        """The leased host uid/gid the kernel runs as (None: the host's own, unprivileged)."""
        return self._lease.identity if self._lease is not None else None

    def adopt(self, kernel_pid: int) -> None:
        """Record the runtime's host pid, given its pid as the kernel sees it.

        The runtime must be a descendant of the launched process; inside a PID namespace its
        host pid is found through the ``NSpid`` line of ``/proc/<pid>/status``.
        """
        for pid in self.descendants():
            if innermost_pid(pid) == kernel_pid:
                self._kernel_pid = pid
                return

    def interrupt(self) -> None:
        """SIGINT the runtime process (not the supervisor, not user children)."""
        if self._kernel_pid is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._kernel_pid, signal.SIGINT)

    def alive(self) -> bool:
        """Whether the supervisor is still running."""
        return self._proc.returncode is None

    def descendants(self) -> list[int]:
        """Pids of every live process under the supervisor.

        Read from ``/proc/<pid>/task/*/children`` down the tree: the cost grows with this
        kernel's processes only (``psutil``'s ``children()`` reads every process's ``stat``,
        which made each start cost O(kernels on the host): 22 ms with 384 kernels).
        """
        return descendants(self._proc.pid)

    async def kill(self) -> None:
        """Kill the whole tree and wait; remove the cgroup and the directory. Idempotent.

        Cancellation-safe: the teardown runs to its end in a task of its own even when the
        caller is cancelled, and every call (a repeat after a cancellation too) waits for that
        same teardown.
        """
        if self._teardown is None:
            self._teardown = asyncio.get_running_loop().create_task(
                self._kill_ladder(), name=f"sunroom-kill-{self._proc.pid}"
            )
        await asyncio.shield(self._teardown)

    def _signal(self, sig: signal.Signals) -> None:
        """Send *sig* to the supervisor, never reaping it.

        Not ``Process.send_signal``: the standard library's ``Popen.send_signal`` first polls
        (``waitpid(pid, WNOHANG)``), which reaps a supervisor that has just exited under the
        nose of asyncio's child watcher; the watcher then logs "Unknown child process pid N,
        will report returncode 255" and the real exit status is lost (issue 26, item 6).
        The pidfd names this very process even after its pid is reaped and reused.
        """
        if self._proc.returncode is not None:
            return
        pidfd = self._proc.pidfd
        with contextlib.suppress(ProcessLookupError):
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(self._proc.pid, sig)

    def _signal_inner(self, sig: signal.Signals) -> bool:
        """Send *sig* to the launched process's only child; False when it has none (yet).

        For a launcher that waits for its child, as bubblewrap waits for the first process of
        the kernel's PID namespace: when that process dies the kernel kills every other process
        of the namespace and the launcher exits only once they are all gone, so the launcher's
        exit means the whole kernel is gone (SIGKILL of bubblewrap itself left the namespace
        dying for a second or two after it, its processes re-parented to the host's init).
        The child is named by a pidfd, checked to be still the launcher's child once opened.
        """
        pid = self._proc.pid
        kids = children(pid)
        if len(kids) != 1:
            return False
        try:
            pidfd = os.pidfd_open(kids[0])
        except OSError:
            return False
        try:
            if children(pid) != kids:  # it ended (and its pid may be another's) meanwhile
                return False
            signal.pidfd_send_signal(pidfd, sig)
        except OSError:
            return False
        finally:
            os.close(pidfd)
        return True

    async def _kill_ladder(self) -> None:
        if self._proc.returncode is None:
            if not (self._stop_inner and self._signal_inner(self._stop_signal)):
                self._signal(self._stop_signal)
            try:
                await asyncio.wait_for(self._proc.wait(), 3.0)
            except TimeoutError:
                await asyncio.to_thread(self._hard_kill)
                await self._proc.wait()
        self._read_status()
        self._proc.close()
        await close_companions(self.companions)
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)
        with contextlib.suppress(OSError):
            os.close(self._status_fd)
        await asyncio.to_thread(remove_tree, self._rundir)
        if self._lease is not None:
            # every process is gone (a straggler would keep the uid out of use anyway)
            self._lease.release()

    def _hard_kill(self) -> None:
        for pid in self.descendants():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self._signal(signal.SIGKILL)
        if self._cgroup is not None:
            self._cgroup.kill_all()

    def _read_status(self) -> None:
        if self._status is not None:
            return
        try:
            os.set_blocking(self._status_fd, False)
            data = os.read(self._status_fd, 64)
            self._status = data.decode("ascii", "replace") or None
        except (BlockingIOError, OSError):
            self._status = None

    async def wait_reported(self, within_s: float) -> bool:
        """Wait until the supervisor reports the runtime's end (or exits); False on time out.

        The report comes once the runtime and its processes are gone, whether or not the
        supervisor stays on for the kernel's copies.
        """
        try:
            await asyncio.wait_for(self._status_or_exit(), within_s)
        except TimeoutError:
            return False
        return True

    async def _status_or_exit(self) -> None:
        wait = asyncio.ensure_future(self._proc.wait())
        try:
            while not wait.done() and self._status is None:
                try:
                    if readable(self._status_fd):
                        return
                except OSError:  # closed by a teardown
                    return
                await asyncio.wait({wait}, timeout=0.01)
        finally:
            wait.cancel()

    async def log_tail(self, size: int = 4000) -> str:
        """The end of the kernel's own stderr before its output capture began (start failures)."""
        return await asyncio.to_thread(_tail, self._rundir / "kernel.log", size)

    async def exit_reason(self) -> str:
        """Classify the death: out of memory, a signal, or an exit status.

        Waits (up to 5 s) for the supervisor to report the runtime's end: it does so at once,
        and exits later when the kernel's copies still run.
        """
        await self.wait_reported(5.0)
        self._read_status()
        oom = self._cgroup is not None and self._cgroup.oom_kills() > self._oom_before
        if not oom and not self._status:
            return f"the kernel's supervisor ended (return code {self._proc.returncode})"
        return describe_status(self._status or "", oom=oom, memory_mb=self._memory_mb)


class Companion(Protocol):
    """A host resource that lives as long as a kernel's sandbox (e.g. its egress proxy)."""

    async def aclose(self) -> None:
        """Release it; idempotent."""
        ...


async def close_companions(companions: list[Companion]) -> None:
    """Close every companion (most recent first); a failure is logged, never raised."""
    while companions:
        companion = companions.pop()
        try:
            await companion.aclose()
        except Exception:
            log.exception("closing %r after its kernel failed", companion)


def make_ipc_dir(
    path: Path, program: ExecSpec, kernel_side: str, identity: Identity | None
) -> Path:
    """Create the IPC directory *path* and *program*'s files in it (see LocalLaunch)."""
    path.mkdir(mode=0o700)
    gid = identity.gid if identity is not None else -1
    for name, text in program.files.items():
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"an IPC file name must be a plain name, not {name!r}")
        file = path / name
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text.replace(IPC_TOKEN, kernel_side))
        if identity is not None:
            os.chown(file, -1, gid)
            os.chmod(file, 0o640)
    if identity is not None:
        os.chown(path, -1, gid)
        os.chmod(path, 0o730)
    return path


def seal_ipc_dir(path: Path) -> None:
    """Close the IPC directory for writing once the kernel has made its sockets.

    As root, the kernel (of the directory's group) keeps only the right to pass through:
    it cannot fill the host's disk there. As an unprivileged user the kernel runs as that
    user and could undo it, so nothing is done (see docs/security.md).
    """
    st = path.stat()
    if st.st_uid == os.geteuid() == 0 and st.st_gid != 0:
        os.chmod(path, 0o710)


def exec_config(program: ExecSpec, *, python: str, ipc: str) -> dict[str, object]:
    """The supervisor's ``exec`` config for *program*, its tokens replaced."""
    argv = [a.replace(IPC_TOKEN, ipc) for a in program.argv]
    if argv and argv[0] == PYTHON_TOKEN:
        argv[0] = python
    env = {k: v.replace(IPC_TOKEN, ipc) for k, v in program.env.items()}
    return {"argv": argv, "env": env, "attach": program.attach}


def describe_status(status: str, *, oom: bool, memory_mb: int) -> str:
    """A person's sentence for a supervisor's status word (``exit:N``, ``signal:N``)."""
    if oom:
        return f"the kernel ran out of memory (limit {memory_mb} MB) and was killed"
    if status.startswith("signal:"):
        num = int(status.split(":")[1])
        name = _SIGNAL_NAMES.get(num, str(num))
        if num == signal.SIGKILL:
            return f"the kernel was killed by {name} (possibly out of memory)"
        return f"the kernel died from signal {name}"
    if status.startswith("exit:"):
        return f"the kernel process exited with status {status.split(':')[1]}"
    return "the kernel's supervisor ended without saying how the kernel did"


def _tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def innermost_pid(pid: int) -> int | None:
    """The pid of *pid* in its innermost PID namespace (itself outside any namespace)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return pid


GATE: Final = 'read -r _ && exec "$@" </dev/null'
"""The shell gate a launch waits in until the host has moved it into the kernel's cgroup."""


@final
class LocalLaunch:
    """The host resources of one local supervised kernel, from preparation to spawn.

    :meth:`prepare` makes a private run directory, the socketpair, the status pipe, the
    kernel's identity (a leased unprivileged uid when sunroom runs as root) and (when asked and
    possible) the cgroup; :meth:`spawn` starts the supervisor with the kernel's ends of them
    and returns the process handle and the host's end of the socket. If the spawn fails, every
    resource is released and KernelStartError is raised.

    With a leased identity the process is started as that uid/gid with no supplementary
    groups; with a cgroup, the host (which may be root, while the process no longer is) writes
    its pid into the cgroup before any process of the kernel is forked. Where it waits meanwhile
    is :attr:`supervisor_gates`: in sunroom's supervisor, which starts its interpreter and its
    imports during the move and forks nothing before the host's ``go`` (the ``subprocess``
    backend: the move costs the start nothing), or at a gate before the first program, the
    compiled launcher's or a one-line shell's (:func:`first_argv`; bubblewrap, which forks as
    it starts: every process of the kernel is counted from its first instruction).
    """

    def __init__(
        self,
        rundir: Path,
        cgroup: Cgroup | None,
        lease: IdentityLease | None,
        *,
        supervisor_gates: bool = False,
        watch: dict[str, object] | None = None,
    ) -> None:
        self.rundir = rundir
        self.cgroup = cgroup
        self.lease = lease
        self.supervisor_gates = supervisor_gates
        self.watch = watch_config() if watch is None else watch  # the watcher's choice
        self.host_sock, self.kernel_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.status_r, self.status_w = os.pipe()

    @property
    def identity(self) -> Identity | None:
        """The uid/gid the kernel will run as (None: this process's own, unprivileged)."""
        return self.lease.identity if self.lease is not None else None

    @classmethod
    async def prepare(
        cls,
        *,
        prefix: str,
        nonce: str,
        limits: Limits,
        cgroups: bool,
        lease: IdentityLease | None = None,
        supervisor_gates: bool = False,
    ) -> LocalLaunch:
        """Create the run directory and, if *cgroups*, try to create the kernel's cgroup.

        Takes ownership of *lease*: it is released with the kernel (or by :meth:`abandon`).
        With *supervisor_gates* the first program started is sunroom's supervisor, which
        waits for the cgroup move itself (:attr:`supervisor_gates`).
        """
        cgroup = None
        try:
            watch = watch_config()  # a bad choice is refused before anything is made
            if cgroups:
                await asyncio.to_thread(sweep_orphans_once)  # what killed hosts left
                cgroup = await asyncio.to_thread(
                    Cgroup.create,
                    cgroup_name(nonce),
                    memory_mb=limits.memory_mb,
                    pids=limits.pids,
                    cpu_quota=limits.cpu_quota,
                )
            rundir = make_rundir(prefix)
            if lease is not None:
                os.chmod(rundir, 0o711)  # the kernel's uid may pass through, never list
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            if lease is not None:
                lease.release()
            raise
        return cls(rundir, cgroup, lease, supervisor_gates=supervisor_gates, watch=watch)

    def make_workdir(self) -> Path:
        """Create ``<rundir>/work``, private to the kernel's uid (mode 0700)."""
        workdir = self.rundir / "work"
        workdir.mkdir(mode=0o700)
        if self.lease is not None:
            os.chown(workdir, self.lease.identity.uid, self.lease.identity.gid)
        return workdir

    def make_ipc_dir(self, program: ExecSpec, kernel_side: str) -> Path:
        """Create ``<rundir>/ipc`` for *program*, with its files; see :func:`seal_ipc_dir`.

        :data:`~sunroom.sandbox.backend.IPC_TOKEN` in the files becomes *kernel_side*, the
        directory as the kernel sees it. As root (the kernel has its own uid), the directory
        and its files belong to root with the kernel's group: the kernel may create its
        sockets (mode 0730) and read its files (0640), and cannot change either.
        """
        return make_ipc_dir(self.rundir / "ipc", program, kernel_side, self.identity)

    def private_file(self, name: str, content: bytes = b"") -> Path:
        """A read-only file in the run directory that the kernel's uid may read."""
        path = self.rundir / name
        path.write_bytes(content)
        os.chmod(path, 0o444)
        return path

    def supervisor_config(
        self,
        *,
        nonce: str,
        limits: Limits,
        program: ExecSpec | None = None,
        python: str = "",
        ipc: str = "",
    ) -> dict[str, object]:
        """The supervisor's config for these resources (callers add backend-specific keys).

        With *program*, the supervisor execs it instead of sunroom's runtime: its tokens are
        replaced here (*python*: the interpreter as the kernel sees it, *ipc*: the IPC
        directory as the kernel sees it).
        """
        config: dict[str, object] = {
            "fd": self.kernel_sock.fileno(),
            "status_fd": self.status_w,
            "nonce": nonce,
            "max_frame": limits.max_frame_bytes,
            "rlimits": limits.rlimits(),
            **self.watch,
        }
        if self.cgroup is not None and self.supervisor_gates:
            config["gate"] = True  # the supervisor waits for the host's "go" on stdin
        if program is not None:
            config["exec"] = exec_config(program, python=python, ipc=ipc)
        return config

    def abandon(self) -> None:
        """Release everything without spawning (a launch that failed before the spawn)."""
        for sock in (self.host_sock, self.kernel_sock):
            sock.close()
        for fd in (self.status_r, self.status_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.cgroup is not None:
            self.cgroup.remove()
        remove_tree(self.rundir)
        if self.lease is not None:
            self.lease.release()

    async def spawn(
        self,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        workdir: Path,
        memory_mb: int,
        extra_fds: tuple[int, ...] = (),
        stop_signal: signal.Signals = signal.SIGTERM,
        stop_inner: bool = False,
    ) -> tuple[SupervisedProcess, socket.socket]:
        """Start *argv* in a new session with the kernel's fds; raises KernelStartError.

        The process runs as :attr:`identity` when there is one; with a cgroup it is gated
        until the host has put it in the cgroup (see the class docstring).
        """
        gated = self.cgroup is not None
        try:
            argv, creds = first_argv(
                argv,
                identity=self.identity,
                gate=gated and not self.supervisor_gates,
                launcher=compiled_launcher(),
                setpriv=_setpriv_path(),
            )
        except BaseException:
            self.abandon()
            raise
        gate_r, gate_w = os.pipe() if gated else (-1, -1)
        try:
            with open(self.rundir / "kernel.log", "wb") as log:  # noqa: ASYNC230 - local create
                proc = child.spawn(
                    argv,
                    stdin=gate_r if gated else subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    pass_fds=(self.kernel_sock.fileno(), self.status_w, *extra_fds),
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                    **creds,
                )
        except BaseException as exc:  # nothing of the launch may leak
            if gated:
                os.close(gate_r)
                os.close(gate_w)
            self.abandon()
            if isinstance(exc, OSError):
                raise KernelStartError(f"cannot start {argv[0]}: {exc}") from exc
            raise
        self.kernel_sock.close()
        with contextlib.suppress(OSError):
            os.close(self.status_w)
        handle = SupervisedProcess(
            proc,
            status_fd=self.status_r,
            rundir=self.rundir,
            workdir=workdir,
            cgroup=self.cgroup,
            memory_mb=memory_mb,
            stop_signal=stop_signal,
            stop_inner=stop_inner,
            lease=self.lease,
        )
        if gated:
            os.close(gate_r)
            try:
                assert self.cgroup is not None
                await asyncio.to_thread(self.cgroup.add, proc.pid)
                os.write(gate_w, b"go\n")
            except (ProcessLookupError, BrokenPipeError):
                # it ended at its gate (the supervisor runs its imports there): it forked
                # nothing, and the wait for its hello reports the end with its log
                pass
            except BaseException as exc:
                await handle.kill()
                self.host_sock.close()
                if isinstance(exc, OSError):
                    raise KernelStartError(
                        f"cannot move the kernel into its cgroup: {exc.strerror}"
                    ) from exc
                raise
            finally:
                os.close(gate_w)
        return handle, self.host_sock


def first_argv(
    argv: list[str],
    *,
    identity: Identity | None,
    gate: bool,
    launcher: str | None,
    setpriv: str | None,
) -> tuple[list[str], dict[str, Any]]:
    """The command line that starts *argv* as *identity*, and the credentials Popen still needs.

    With *gate*, it first waits for one line on its standard input (the host writes it once
    the process is in the kernel's cgroup), which is then ``/dev/null``.

    With an identity and the compiled *launcher* (``sunroom-launch``; docs/design.md, "The
    launcher"), which needs an absolute program path: one exec that drops to it and gates.
    Otherwise the shell gate (:data:`GATE`), prefixed with *setpriv* for the identity, or,
    without setpriv, ``Popen``'s ``user``, ``group`` and ``extra_groups`` (asked for a user,
    Popen forks this process, page tables and thread stacks: O(kernels), and waits for the
    exec; without, it vforks: with 384 kernels, 10 ms -> 4 ms of the event loop per start).

    Popen cannot clear capabilities: leaving uid 0 clears the permitted, effective and ambient
    sets (unless the host's securebits keep them) but never the inheritable one. So that last
    path raises SandboxUnavailableError, naming both fixes, when this process holds any
    inheritable capability (every ambient one is also inheritable) or cannot tell.
    """
    if identity is not None and launcher is not None and os.path.isabs(argv[0]):
        return [launcher, str(identity.uid), str(identity.gid), "1" if gate else "0", *argv], {}
    if gate:
        argv = ["/bin/sh", "-c", GATE, "sunroom-gate", *argv]
    if identity is None:
        return argv, {}
    if setpriv is None:
        refuse_inheritable_capabilities()
        return argv, {"user": identity.uid, "group": identity.gid, "extra_groups": []}
    return [*_setpriv(setpriv, identity.uid, identity.gid), *argv], {}


_CAN_CLEAR: Final = "run sunroom build-helpers (needs a C compiler) or install setpriv (util-linux)"


def refuse_inheritable_capabilities(status: str = "/proc/self/status") -> None:
    """Raise SandboxUnavailableError unless this process's inheritable capabilities are none.

    *status* is where the kernel reports them (``CapInh``, hexadecimal; a test points it
    elsewhere).
    """
    try:
        with open(status, encoding="ascii") as lines:
            held = next(line.split(":", 1)[1] for line in lines if line.startswith("CapInh:"))
        mask = int(held, 16)
    except (OSError, StopIteration, ValueError, UnicodeDecodeError):
        raise SandboxUnavailableError(
            f"cannot tell whether this host holds inheritable capabilities, which a kernel "
            f"started without a launcher would keep: {_CAN_CLEAR}"
        ) from None
    if mask:
        raise SandboxUnavailableError(
            f"this host holds inheritable capabilities (CapInh {mask:#x}), which a kernel "
            f"started without a launcher would keep: {_CAN_CLEAR}"
        )


@functools.cache
def _setpriv_path() -> str | None:
    """Where ``setpriv`` is on this host's PATH, looked up once (not on every kernel's start)."""
    return shutil.which("setpriv")


def _setpriv(path: str, uid: int, gid: int) -> list[str]:
    """The argv prefix that runs a program as *uid*:*gid* with no supplementary groups.

    *path* is ``setpriv`` (util-linux); it sets the real, effective and saved ids before the
    program runs, and clears the inheritable and ambient capabilities (where the host's
    securebits keep capabilities across leaving uid 0, an ambient one survives the exec).
    """
    return [
        path, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
        "--ambient-caps=-all", "--",
    ]  # fmt: skip
