"""Reaping a kernel's single copies: each status reported once, even when reaping nests.

Python runs a ``SIGCHLD`` handler on the main thread whatever that thread's signal mask (another
thread may take the signal), so the handler can call :func:`forking.reap` while a reap is
running. These tests make that happen at a chosen point with real child processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sunroom.prelude import forking


class NestingCopies(dict[int, int | None]):
    """The copies map; the first ``pop`` runs :func:`forking.reap` again, as a handler would."""

    def __init__(self, runtime: FakeRuntime) -> None:
        super().__init__()
        self.runtime = runtime
        self.nested = 0

    def pop(self, key: int, default: int | None = None) -> int | None:  # type: ignore[override]
        if self.nested == 0:
            self.nested += 1
            forking.reap(self.runtime)  # type: ignore[arg-type]
        return super().pop(key, default)


@dataclass
class FakeRuntime:
    """The part of the kernel's runtime that reaping uses."""

    own_fds: frozenset[int] = frozenset()
    copies: dict[int, int | None] = field(default_factory=dict)


def _child(code: int) -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(code)
    return pid


def _ended(pid: int) -> None:
    """Wait until *pid* has exited (a zombie), without reaping it."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def test_a_reap_inside_a_reap_reports_each_copy_once() -> None:
    runtime = FakeRuntime()
    runtime.copies = NestingCopies(runtime)
    pipes = {}
    for code in (3, 4, 5):
        r, w = os.pipe()
        pid = _child(code)
        _ended(pid)
        runtime.copies[pid] = w
        pipes[pid] = (r, code)
    forking.reap(runtime)  # type: ignore[arg-type]
    assert runtime.copies == {}
    for r, code in pipes.values():
        assert os.read(r, 64) == f"exit:{code}".encode()
        assert os.read(r, 64) == b""  # written once, and closed
        os.close(r)


def test_a_copy_that_ends_while_reaping_is_reaped_by_the_same_call() -> None:
    runtime = FakeRuntime()
    late_r, late_w = os.pipe()
    gate_r, gate_w = os.pipe()
    late = os.fork()
    if late == 0:
        os.read(gate_r, 1)
        os._exit(7)
    first_r, first_w = os.pipe()
    first = _child(0)
    _ended(first)
    runtime.copies[first] = first_w

    class EndLate(dict[int, int | None]):
        """Lets the late copy end, then calls reap as a handler would, during the first pop."""

        def pop(self, key: int, default: int | None = None) -> int | None:  # type: ignore[override]
            if key == first:
                os.write(gate_w, b"x")
                _ended(late)
                forking.reap(runtime)  # type: ignore[arg-type]  # asks for another round
            return super().pop(key, default)

    copies = EndLate()
    copies[late] = late_w  # checked first in the round (still running), then it ends
    copies[first] = first_w
    runtime.copies = copies
    forking.reap(runtime)  # type: ignore[arg-type]
    assert runtime.copies == {}
    assert os.read(first_r, 64) == b"exit:0"
    assert os.read(late_r, 64) == b"exit:7"
    for fd in (first_r, late_r, gate_r, gate_w):
        os.close(fd)
