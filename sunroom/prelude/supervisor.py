"""The supervisor: the first process of every kernel, which reaps and kills all descendants.

Started by the host as ``python -I -c ... supervisor.main(config_json)``. It makes itself a
child subreaper (``PR_SET_CHILD_SUBREAPER``) so that every orphaned descendant, double-forked
``setsid`` daemons included, is re-parented to it; asks for ``SIGTERM`` when its parent dies
(``PR_SET_PDEATHSIG``); applies rlimits (the host has already put it in the kernel's cgroup);
then forks the kernel runtime (no second interpreter start). When the kernel exits, or on
``SIGTERM``, it stops and kills every descendant, reaps them all, reports the kernel's exit on
the status fd and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys
import time

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


class _Terminate(Exception):
    pass


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def descendants(root: int) -> list[int]:
    """Every live descendant of *root*, read from ``/proc/<pid>/task/*/children``."""
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
            found.extend(kids)
            stack.extend(kids)
    return found


def sweep(deadline_s: float = 10.0) -> None:
    """Stop, kill and reap every descendant until none is left (or the deadline passes)."""
    me = os.getpid()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = descendants(me)
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
        if not pids:
            time.sleep(0.001)


def _apply_rlimits(limits: dict[str, int]) -> None:
    table = {
        "as": resource.RLIMIT_AS,
        "cpu": resource.RLIMIT_CPU,
        "fsize": resource.RLIMIT_FSIZE,
        "nofile": resource.RLIMIT_NOFILE,
        "core": resource.RLIMIT_CORE,
    }
    for name, value in limits.items():
        key = table[name]
        _, hard = resource.getrlimit(key)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(key, (soft, soft))


def _on_term(signum: int, frame: Any) -> None:
    raise _Terminate


def _connect(path: str) -> int:
    """Connect to the host's listening socket at *path* (docker); return the fd."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    return sock.detach()


def main(config_json: str) -> None:
    """Supervise one kernel described by *config_json*; never returns.

    Config keys: ``fd`` (inherited socket) or ``connect`` (a socket path to connect to),
    ``nonce``, ``max_frame``, ``rlimits``; ``status_fd`` (a pipe for the
    kernel's exit status) or none, in which case the exit status becomes this process's
    (``128 + signal`` for a signal); ``parent_pid`` (checked after asking for the parent-death
    signal) or none; ``forward_sigint`` (relay SIGINT to the kernel runtime, for backends that
    can only signal the container's first process).
    """
    config = json.loads(config_json)
    status_fd: int | None = config.get("status_fd")
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_DUMPABLE, 0)  # the kernel's code may not ptrace or read our memory
    parent = config.get("parent_pid")
    if parent is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(70)  # the host died before we could ask to be told
    fd: int = config["fd"] if "fd" in config else _connect(config["connect"])
    from sunroom.prelude import runtime  # import before fork: the kernel starts warm

    kernel = os.fork()
    if kernel == 0:
        try:
            _prctl(PR_SET_DUMPABLE, 1)  # the runtime is the user's own process
            if status_fd is not None:
                os.close(status_fd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _apply_rlimits(config.get("rlimits", {}))
            runtime.main(fd, config["nonce"], config["max_frame"])
        except BaseException:
            import traceback

            traceback.print_exc()
        os._exit(1)
    os.close(fd)
    if config.get("forward_sigint"):
        signal.signal(signal.SIGINT, lambda *_: _relay(kernel))
    status = "terminated"
    exit_code = 0
    try:
        while True:
            try:
                pid, code = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == kernel:
                if os.WIFSIGNALED(code):
                    status = f"signal:{os.WTERMSIG(code)}"
                    exit_code = 128 + os.WTERMSIG(code)
                else:
                    exit_code = os.waitstatus_to_exitcode(code)
                    status = f"exit:{exit_code}"
                break
    except _Terminate:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sweep()
    if status_fd is not None:
        with contextlib.suppress(OSError):
            os.write(status_fd, status.encode())
        exit_code = 0
    sys.stdout.flush()
    os._exit(exit_code)


def _relay(kernel: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(kernel, signal.SIGINT)
