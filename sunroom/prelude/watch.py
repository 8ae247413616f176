"""Watching a kernel to its end: reap, kill every descendant, report, wait for the copies.

:func:`supervise` is the loop of every supervisor (:mod:`sunroom.prelude.supervisor`, and a
copy's own, :mod:`sunroom.prelude.forking`). Kernel side: standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import types


def descendants(root: int, spare: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Every live descendant of *root*, read from ``/proc/<pid>/task/*/children``.

    The processes in *spare* and their own descendants are left out.
    """
    found: list[int] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            kids = [k for k in kids if k not in spare]
            found.extend(kids)
            stack.extend(kids)
    return found


def sweep(deadline_s: float = 10.0, spare: frozenset[int] | set[int] = frozenset()) -> None:
    """Stop, kill and reap every descendant until none is left (or the deadline passes).

    The processes in *spare* (copies' supervisors) and their descendants are left alone.
    """
    me = os.getpid()
    end = time.monotonic() + deadline_s
    while True:
        pids = descendants(me, spare)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
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
    signal.set_wakeup_fd(watch.wake_w)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    signal.signal(signal.SIGINT, (lambda *_: _relay(kernel)) if forward_sigint else signal.SIG_IGN)
    watch.listen()
    while not _STOP[0]:
        watch.reap()
        if watch.status is not None and watch.kernel_ended():
            break
        watch.wait()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sweep()
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
        self.registry = _Registry(registry_fd, self.copies)
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

    def reap(self) -> None:
        """Reap every child that has ended: the kernel (its status noted), orphans, copies."""
        while True:
            try:
                pid, code = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                return
            self.copies.discard(pid)
            if pid == self.kernel:
                if os.WIFSIGNALED(code):
                    self.status = f"signal:{os.WTERMSIG(code)}"
                    self.exit_code = 128 + os.WTERMSIG(code)
                else:
                    self.exit_code = os.waitstatus_to_exitcode(code)
                    self.status = f"exit:{self.exit_code}"

    def kernel_ended(self) -> bool:
        """After the kernel's end: kill all but the copies, report once; True when none is left."""
        self.registry.drain()  # every copy the kernel made is named before it ended
        self.copies &= set(descendants(os.getpid()))
        sweep(spare=self.copies)
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
                        os.kill(self.kernel, signal.SIGKILL)


class _Registry:
    """The read end of the pipe the runtime names its copies' supervisors on, one pid a line."""

    def __init__(self, fd: int | None, copies: set[int]) -> None:
        self.fd = fd
        self.copies = copies
        self.pending = b""

    def drain(self) -> bool:
        """Read what is there into the copies; False once the pipe is closed (or absent)."""
        if self.fd is None:
            return False
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                return True
            if not data:
                os.close(self.fd)
                self.fd = None
                return False
            *lines, self.pending = (self.pending + data).split(b"\n")
            self.copies.update(int(x) for x in lines if x.strip().isdigit())


def _report(status_fd: int | None, status: str) -> None:
    if status_fd is not None:
        with contextlib.suppress(OSError):
            os.write(status_fd, status.encode())


def _relay(kernel: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(kernel, signal.SIGINT)
