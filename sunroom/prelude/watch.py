"""Watching a kernel to its end: reap, kill every descendant, report, wait for the copies.

:func:`supervise` is the loop of every supervisor (:mod:`sunroom.prelude.supervisor`, and a
copy's own, :mod:`sunroom.prelude.forking`). Kernel side: standard library only.

``watch.c`` beside this module is the same loop compiled (``sunroom-watch``, built by
:mod:`sunroom.sandbox.watcher`): a kernel's supervisor replaces itself with it once it has
forked the runtime (:func:`become_compiled`), so that the watcher of an idle kernel holds a
few pages rather than a second interpreter's. The two carry out one contract, this module's
docstrings; the conformance tests run both.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; unlike signal, no enum import
import _socket
import contextlib
import os
import sys
import time

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import types
    from collections.abc import Callable


COMPILED_NAME = "sunroom-watch"
"""The compiled watcher's file name, beside this module."""


def compiled() -> str | None:
    """The compiled watcher's path when it was built and may be run here, else None."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), COMPILED_NAME)
    return path if os.access(path, os.X_OK) else None


WATCHED_SIGNALS = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGCHLD)
"""The signals the compiled watcher reads from a signalfd: blocked before the exec."""


def become_compiled(
    path: str,
    kernel: int,
    *,
    status_fd: int | None,
    registry_fd: int | None,
    forward_sigint: bool,
    ready_fd: int,
    hangup_fd: int | None = None,
    workdir: str = "",
) -> None:
    """Replace this process with the compiled watcher at *path*; returns only if it cannot.

    Arguments as :func:`supervise`'s; *ready_fd* is the write end of a pipe the runtime waits
    on, which the watcher closes once it may no longer be traced (``PR_SET_DUMPABLE`` 0);
    *workdir* (a copy's, absolute, or empty) is removed once everything has ended, as a
    copy's Python supervisor removes it after :func:`supervise`. The
    watched signals are blocked first, so none is lost in the exec (a blocked signal stays
    pending through it); a ``SIGTERM`` noted before that makes this return, for
    :func:`supervise` to act on. When the exec fails, the reason goes to stderr (the
    kernel's log), the mask is restored and the caller goes on with :func:`supervise`.
    """
    if workdir and not workdir.startswith("/"):  # the watcher would refuse it, unwatched
        return
    old = _signal.pthread_sigmask(_signal.SIG_BLOCK, WATCHED_SIGNALS)
    if _stopping():
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old)
        return
    fds = [fd for fd in (status_fd, registry_fd, ready_fd, hangup_fd) if fd is not None]
    for fd in fds:
        os.set_inheritable(fd, True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    argv = [
        path,
        str(kernel),
        str(-1 if status_fd is None else status_fd),
        str(-1 if registry_fd is None else registry_fd),
        "1" if forward_sigint else "0",
        str(ready_fd),
        str(-1 if hangup_fd is None else hangup_fd),
        workdir,
    ]
    try:
        os.execv(path, argv)
    except OSError as exc:
        sys.stderr.write(
            f"sunroom: the compiled watcher could not start ({exc.strerror or exc}); "
            "the supervisor watches the kernel itself.\n"
        )
        sys.stderr.flush()
    _signal.pthread_sigmask(_signal.SIG_SETMASK, old)


def _stopping() -> bool:
    """Whether a ``SIGTERM`` was noted.

    A call, on purpose: the interpreter runs a Python handler still pending (its signal came
    before the mask) when a function starts.
    """
    return _STOP[0]


def registry_pair() -> tuple[int, int]:
    """A new registry: (the supervisor's end, the runtime's end), both close-on-exec."""
    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    return a.detach(), b.detach()


def _cgroup_of(pid: int | str) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f.read()
    except OSError:
        return None


def descendants(
    root: int, spare: frozenset[int] | set[int] = frozenset(), *, own_cgroup: bool = False
) -> list[int]:
    """Every live descendant of *root*, read from ``/proc/<pid>/task/*/children``.

    The processes in *spare* and their own descendants are left out; with *own_cgroup*, so are
    the processes in a cgroup other than this process's (an owned copy's, and theirs).
    """
    mine = _cgroup_of("self") if own_cgroup else None
    found: list[int] = []
    stack = [root]
    while stack:
        kids = [k for k in children(stack.pop()) if k not in spare]
        if mine is not None:
            kids = [k for k in kids if _cgroup_of(k) in (mine, None)]
        found.extend(kids)
        stack.extend(kids)
    return found


def children(pid: int) -> list[int]:
    """The children of *pid*, of every thread of it ([] when it is gone)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return kids


def sweep(
    deadline_s: float = 10.0,
    spare: frozenset[int] | set[int] = frozenset(),
    *,
    own_cgroup: bool = False,
    on_reaped: Callable[[int, int], None] | None = None,
) -> None:
    """Stop, kill and reap every descendant until none is left (or the deadline passes).

    The processes in *spare* (copies) and their descendants are left alone, and with
    *own_cgroup* every process in another cgroup too (see :func:`descendants`). Each child
    reaped is passed to *on_reaped* with its wait status.
    """
    me = os.getpid()
    end = time.monotonic() + deadline_s
    while True:
        pids = descendants(me, spare, own_cgroup=own_cgroup)
        for sig in (_signal.SIGSTOP, _signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        while True:
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
            if on_reaped is not None:
                on_reaped(pid, code)
        if not pids or time.monotonic() > end:
            return
        time.sleep(0.001)


_STOP = [False]
"""Set by ``SIGTERM``: kill every descendant and exit."""


def on_term(signum: int, frame: types.FrameType | None) -> None:
    """The supervisor's ``SIGTERM`` handler: :func:`supervise` stops at its next turn."""
    _STOP[0] = True


def supervise(
    kernel: int,
    *,
    status_fd: int | None,
    registry_fd: int | None,
    hangup_fd: int | None = None,
    forward_sigint: bool = False,
) -> int:
    """Wait for *kernel* (our child), then stop every descendant; return the exit code to use.

    When the kernel ends, every descendant is killed except the supervisors of the kernel's
    copies (:mod:`sunroom.prelude.forking`),
    whose pids the runtime writes to *registry_fd*, one per line: a copy outlives the kernel it
    was forked from; then the kernel's status goes to *status_fd*, so a host that reads it
    knows the kernel's processes are gone. This process then waits, reaping, until the last
    copy is gone. On
    ``SIGTERM`` every descendant is killed, copies included. When *hangup_fd* (a copy's
    socket) reports that the host hung up, the kernel is killed (it may be stuck in a cell).
    With no *status_fd* the kernel's own exit status is returned (``128 + signal`` for a
    signal), else 0.
    """
    watch = _Watch(kernel, status_fd=status_fd, registry_fd=registry_fd, hangup_fd=hangup_fd)
    _signal.set_wakeup_fd(watch.wake_w)
    _signal.signal(_signal.SIGTERM, on_term)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    _signal.signal(
        _signal.SIGINT, (lambda *_: _relay(kernel)) if forward_sigint else _signal.SIG_IGN
    )
    watch.listen()
    while not _STOP[0]:
        watch.reap()
        if watch.status is not None and watch.kernel_ended():
            break
        watch.wait()
    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    sweep(on_reaped=watch.reaped_copy)  # a kernel killed here was "terminated"
    watch.let_go()
    if watch.status is None:
        _report(status_fd, "terminated")
    return 0 if status_fd is not None else watch.exit_code


class _Watch:
    """The state of one :func:`supervise` loop: the kernel's end, the copies, the fds polled."""

    def __init__(
        self, kernel: int, *, status_fd: int | None, registry_fd: int | None, hangup_fd: int | None
    ) -> None:
        import select

        self.kernel = kernel
        self.status_fd = status_fd
        self.registry_fd = registry_fd
        self.hangup_fd = hangup_fd
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.poller = select.poll()
        self.copies: set[int] = set()
        self.owned: dict[int, _Owned] = {}  # single-process copies in cgroups of their own
        self.by_pidfd: dict[int, int] = {}  # an owned copy's pidfd -> its pid
        self.registry = _Registry(registry_fd, self)
        self.status: str | None = None  # "exit:N" or "signal:N" once the kernel has ended
        self.reported = False
        self.exit_code = 0

    def listen(self) -> None:
        """Poll the wakeup pipe, the hangup fd and the registry (non-blocking) from now on."""
        import select

        self.poller.register(self.wake_r, select.POLLIN)
        if self.hangup_fd is not None:
            self.poller.register(self.hangup_fd, 0)  # POLLHUP and POLLERR are always reported
        if self.registry_fd is not None:
            os.set_blocking(self.registry_fd, False)
            self.poller.register(self.registry_fd, select.POLLIN)

    def own(self, pid: int, status_fd: int, workdir: str) -> None:
        """Take charge of an owned copy (see the module's docstring); watch for its end.

        A copy is the child of this kernel's runtime or of another owned copy (or already
        re-parented here); a message naming any other process is dropped. Past
        :data:`MAX_OWNED` a copy is only spared, like a copy with a supervisor of its own:
        nobody reports its status once its parent is gone (the host then says so).
        """
        import select

        parent = _ppid(pid)
        if pid in (self.kernel, os.getpid()) or (
            parent is not None and parent not in (self.kernel, os.getpid(), *self.owned)
        ):
            os.close(status_fd)  # not a copy of this kernel's: a forged message
            return
        if len(self.owned) >= MAX_OWNED:
            os.close(status_fd)
            self.copies.add(pid)
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # already gone and reaped by the runtime that made it
            os.close(status_fd)
            _remove(workdir)
            return
        self.copies.add(pid)
        self.owned[pid] = _Owned(status_fd, workdir, pidfd)
        self.by_pidfd[pidfd] = pid
        self.poller.register(pidfd, select.POLLIN)

    def reaped(self, pid: int, code: int) -> None:
        """Note a child this process reaped: the kernel's status, or an owned copy's."""
        self.copies.discard(pid)
        if pid == self.kernel:
            self.status = status_word(code)
            self.exit_code = (
                128 + os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.waitstatus_to_exitcode(code)
            )
            return
        owned = self.owned.get(pid)
        if owned is not None:  # re-parented here once the runtime that made it was gone
            _report(owned.status_fd, status_word(code))
            self._gone(pid)

    def reaped_copy(self, pid: int, code: int) -> None:
        """:meth:`reaped`, for anything but the kernel (the last sweep's)."""
        if pid != self.kernel:
            self.reaped(pid, code)

    def _gone(self, pid: int) -> None:
        """An owned copy has ended: let go of its status pipe and pidfd, remove its workdir."""
        owned = self.owned.pop(pid, None)
        self.copies.discard(pid)
        if owned is None:
            return
        self.by_pidfd.pop(owned.pidfd, None)
        with contextlib.suppress(KeyError, ValueError):
            self.poller.unregister(owned.pidfd)
        for fd in (owned.status_fd, owned.pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        _remove(owned.workdir)

    def let_go(self) -> None:
        """At the end: let go of every owned copy still held (they were killed by the sweep)."""
        for pid in list(self.owned):
            self._gone(pid)

    def reap(self) -> None:
        """Reap every child that has ended: the kernel (its status noted), orphans, copies."""
        while True:
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                return
            self.reaped(pid, code)

    def kernel_ended(self) -> bool:
        """After the kernel's end: kill all but the copies, report once; True when none is left."""
        self.registry.drain()  # every copy the kernel made is named before it ended
        alive = set(descendants(os.getpid()))
        for pid in [p for p in self.owned if p not in alive]:
            self._gone(pid)
        self.copies &= alive
        sweep(spare=self.copies, own_cgroup=bool(self.owned), on_reaped=self.reaped)
        if not self.reported and self.status is not None:  # its processes are gone: say so now
            _report(self.status_fd, self.status)
            self.reported = True
        return not self.copies

    def wait(self) -> None:
        """Wait (at most a second) for a signal, a registry line or the host's hangup."""
        try:
            events = self.poller.poll(1000)
        except InterruptedError:
            return
        for fd, _ in events:
            if fd == self.wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 512)
            elif fd == self.registry_fd:
                if not self.registry.drain():
                    self.poller.unregister(fd)
            elif fd == self.hangup_fd:  # the host closed the kernel or died: end the kernel
                self.poller.unregister(fd)
                if self.status is None:
                    with contextlib.suppress(OSError):
                        os.kill(self.kernel, _signal.SIGKILL)
            elif fd in self.by_pidfd:  # an owned copy ended; if it is our child, reap() has it
                self.reap()
                pid = self.by_pidfd.get(fd)
                if pid is not None and not _is_child(pid):
                    self._gone(pid)  # the runtime that made it reaps it and reports


class _Owned:
    """What the supervisor holds of an owned copy: its status pipe, its workdir, its pidfd."""

    __slots__ = ("pidfd", "status_fd", "workdir")

    def __init__(self, status_fd: int, workdir: str, pidfd: int) -> None:
        self.status_fd = status_fd
        self.workdir = workdir
        self.pidfd = pidfd


class _Registry:
    """The supervisor's end of the registry socket: one message per copy (module docstring)."""

    def __init__(self, fd: int | None, watch: _Watch) -> None:
        self.fd = fd
        self.watch = watch
        self.sock = _socket.socket(fileno=fd) if fd is not None else None

    def drain(self) -> bool:
        """Take in the messages waiting; False once the socket is closed (or absent)."""
        sock = self.sock
        if sock is None:
            return False
        while True:
            try:
                data, ancillary, _, _ = sock.recvmsg(4096, _FDS_SPACE)
            except BlockingIOError:
                return True
            except OSError:
                data, ancillary = b"", []
            fds = _fds_of(ancillary)
            if not data:
                for fd in fds:
                    os.close(fd)
                sock.close()
                self.sock = self.fd = None
                return False
            head, _, workdir = data.decode("utf-8", "surrogateescape").partition("\t")
            head = head.strip()
            pid = int(head) if head.isdigit() and len(head) < 10 else None  # pid_t, not beyond
            if pid is None:
                for fd in fds:
                    os.close(fd)
            elif fds:
                for extra in fds[1:]:
                    os.close(extra)
                self.watch.own(pid, fds[0], workdir)
            else:
                self.watch.copies.add(pid)


_FDS_SPACE = _socket.CMSG_SPACE(4 * 4)
"""Room for the descriptors one registry message may carry (one is expected)."""


def _fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, usable, 4))
    return fds


MAX_OWNED = 256
"""The most copies one supervisor owns at once (each holds two of its descriptors)."""


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _is_child(pid: int) -> bool:
    return _ppid(pid) == os.getpid()


def status_word(code: int) -> str:
    """A wait status as the status pipes carry it: ``exit:N`` or ``signal:N``."""
    if os.WIFSIGNALED(code):
        return f"signal:{os.WTERMSIG(code)}"
    return f"exit:{os.waitstatus_to_exitcode(code)}"


def _remove(workdir: str) -> None:
    """Remove an owned copy's workdir (an isolated copy's has none here: empty)."""
    if workdir:
        import shutil

        with contextlib.suppress(OSError):  # best effort: the sandbox goes with the family
            shutil.rmtree(workdir)


def _report(status_fd: int | None, status: str) -> None:
    if status_fd is not None:
        with contextlib.suppress(OSError):
            os.write(status_fd, status.encode())


def _relay(kernel: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(kernel, _signal.SIGINT)
