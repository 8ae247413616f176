"""Removing a run directory never changes the shared directory it lives in."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sunroom.sandbox.rundirs import remove_tree


def test_removing_a_run_directory_that_is_gone_leaves_its_parent_alone(tmp_path: Path) -> None:
    # found by the crash suite: two sweeps raced for one stale directory; the loser's error
    # handler made its parent (/tmp) 0700, and every unprivileged kernel (bwrap) failed after
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    remove_tree(shared / "sunroom-gone")
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777


def test_read_only_directories_inside_are_still_removed(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    run = shared / "sunroom-run"
    (run / "a" / "b").mkdir(parents=True)
    (run / "a" / "b" / "f").write_text("x")
    os.chmod(run / "a" / "b", 0o500)
    os.chmod(run / "a", 0o500)
    remove_tree(run)
    assert not run.exists()
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
