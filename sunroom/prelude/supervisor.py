"""The supervisor: the first process of every kernel, which reaps and kills all descendants.

Started by the host as ``python -I -c ... supervisor.main(config_json)``. It makes itself a child
subreaper (``PR_SET_CHILD_SUBREAPER``) so that every orphaned descendant, double-forked
``setsid`` daemons included, is re-parented to it; asks for ``SIGTERM`` when its parent dies
(``PR_SET_PDEATHSIG``); joins the kernel's cgroups; applies rlimits; then forks the kernel
runtime (no second interpreter start). When the kernel exits, or on ``SIGTERM``, it stops and
kills every descendant, reaps them all, reports the kernel's exit on the status fd and exits.
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
from typing import Any

PR_SET_PDEATHSIG = 1
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


def main(config_json: str) -> None:
    """Supervise one kernel described by *config_json*; never returns."""
    config = json.loads(config_json)
    status_fd: int = config["status_fd"]
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != config["parent_pid"]:
        os._exit(70)  # the host died before we could ask to be told
    for procs in config.get("cgroup_procs", []):
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    from sunroom.prelude import runtime  # import before fork: the kernel starts warm

    kernel = os.fork()
    if kernel == 0:
        try:
            os.close(status_fd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _apply_rlimits(config.get("rlimits", {}))
            runtime.main(config["fd"], config["nonce"], config["max_frame"])
        except BaseException:
            import traceback

            traceback.print_exc()
        os._exit(1)
    os.close(config["fd"])
    status = "terminated"
    try:
        while True:
            try:
                pid, code = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == kernel:
                if os.WIFSIGNALED(code):
                    status = f"signal:{os.WTERMSIG(code)}"
                else:
                    status = f"exit:{os.waitstatus_to_exitcode(code)}"
                break
    except _Terminate:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sweep()
    with contextlib.suppress(OSError):
        os.write(status_fd, status.encode())
    sys.stdout.flush()
    os._exit(0)
