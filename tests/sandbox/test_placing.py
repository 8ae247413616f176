"""Single copies placed as the kernel names them: only the forking runtime's children, in order.

``_Placing`` runs in the host's thread while the kernel forks (``forked`` notifications), and
the fork's answer has the last word. Here the "forking runtime" is this test process and its
copies are real child processes; with no cgroups given, nothing is moved.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from sunroom.errors import KernelStartError
from sunroom.sandbox.forking import _Placing


@pytest.fixture
def kids() -> Iterator[list[int]]:
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_copies_named_as_forked_then_answered_are_placed_in_order(kids: list[int]) -> None:
    placing = _Placing(os.getpid(), [None, None, None])
    placing.place(kids[0])
    placing.place(kids[1])
    # the answer names one copy no notification did: placed then
    assert placing.finish(kids) == [(pid, pid) for pid in kids]


def test_the_answer_must_name_the_copies_already_placed(kids: list[int]) -> None:
    placing = _Placing(os.getpid(), [None, None])
    placing.place(kids[0])
    with pytest.raises(KernelStartError, match="does not name the copies"):
        placing.finish([kids[1], kids[0]])
    with pytest.raises(KernelStartError, match="does not name the copies"):
        _Placing(os.getpid(), [None, None]).finish([kids[0]])


def test_only_the_forking_runtimes_children_can_be_named(kids: list[int]) -> None:
    placing = _Placing(os.getpid(), [None, None])
    with pytest.raises(KernelStartError, match="not the forking kernel's child"):
        placing.place(1)  # init: not ours
    with pytest.raises(KernelStartError, match="not the forking kernel's child"):
        placing.place(os.getpid())
    placing.place(kids[0])
    placing.place(kids[1])
    with pytest.raises(KernelStartError, match="more copies than it was asked for"):
        placing.place(kids[2])
