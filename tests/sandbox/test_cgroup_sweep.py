"""The sweep of the empty cgroups that host processes killed before they could remove them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sunroom.sandbox.cgroup import Cgroup, cgroup_name, sweep_orphans
from tests.conftest import _names


def _make(name: str) -> Cgroup:
    cgroup = Cgroup.create(name, memory_mb=64, pids=16, cpu_quota=None)
    if cgroup is None:
        if "bwrap" in _names("SUNROOM_REQUIRE_BACKENDS", ""):
            pytest.fail("the cgroup tree is not writable here, and bwrap (which needs it) is")
        pytest.skip("no writable cgroup tree here")
    return cgroup


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def made() -> Iterator[list[Cgroup]]:
    cgroups: list[Cgroup] = []
    yield cgroups
    for cgroup in cgroups:
        cgroup.remove()


def test_a_dead_hosts_empty_cgroups_go_and_nothing_else(made: list[Cgroup]) -> None:
    dead = _dead_pid()
    orphan = _make(f"sunroom-{dead}-{'a' * 16}")
    busy = _make(f"sunroom-{dead}-{'b' * 16}")  # its maker is gone, a process is still in it
    mine = _make(cgroup_name("c" * 32))
    live = _make(f"sunroom-1-{'d' * 16}")  # made by a process that lives (pid 1)
    unnamed = _make(f"sunroom-{'e' * 16}")  # the old name, which names no maker
    made.extend([orphan, busy, mine, live, unnamed])
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        busy.add(sleeper.pid)
        assert sweep_orphans() >= len(orphan.dirs)
        assert not any(d.exists() for d in orphan.dirs)
        for kept in (busy, mine, live, unnamed):
            assert all(d.is_dir() for d in kept.dirs), kept.dirs
        assert busy.pids() == {sleeper.pid}
    finally:
        sleeper.kill()
        sleeper.wait()
    assert mine.dirs[0].name == f"sunroom-{os.getpid()}-{'c' * 16}"
