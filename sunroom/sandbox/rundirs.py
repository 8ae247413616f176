"""Private run directories of local kernels, and the sweep of those a dead host left behind.

Each directory (``/tmp/sunroom-*``) holds an ``owner`` file naming the host process that made
it (pid and start time). A host killed with ``kill -9`` cannot remove its directories; the first
launch of every later host process removes each one whose owner is gone (a pid that no longer
exists, or exists with another start time: it was reused). Directories without an ``owner``
file, or that belong to another user, are never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Final

import psutil

PREFIX: Final = "sunroom-"
OWNER_FILE: Final = "owner"

_log = logging.getLogger(__name__)
_swept = False
_sweep_lock = threading.Lock()


def _token(pid: int) -> str | None:
    """``"<pid> <start time>"`` for a live process, None when it does not exist."""
    try:
        return f"{pid} {psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def make_rundir(prefix: str, *, parent: str | os.PathLike[str] | None = None) -> Path:
    """Create a private (0700) run directory named ``<prefix>…`` recording this process as owner.

    *prefix* must start with ``sunroom-``. Sweeps stale directories first (once per process).
    """
    if not prefix.startswith(PREFIX):
        raise ValueError(f"run directory prefixes start with {PREFIX!r}")
    sweep_once(parent)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (path / OWNER_FILE).write_text(_token(os.getpid()) or str(os.getpid()))
    return path


def remove_tree(path: Path) -> None:
    """Remove *path* even where the kernel made directories read-only.

    Only directories inside *path* (and *path* itself) are made writable; its parent (the
    shared temporary directory) is never touched, and a *path* another process removed first
    (a concurrent sweep) is left at that.
    """
    top = os.path.abspath(path)

    def fix(p: str) -> None:
        if not os.path.lexists(p):
            return  # removed meanwhile
        if os.path.abspath(p) != top:
            with contextlib.suppress(OSError):
                os.chmod(os.path.dirname(p), stat.S_IRWXU)
        with contextlib.suppress(OSError):
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda f, p, e: fix(p))
    else:
        shutil.rmtree(path, onerror=lambda f, p, e: fix(p))


def sweep_once(parent: str | os.PathLike[str] | None = None) -> None:
    """Run :func:`sweep_stale` the first time it is called in this process."""
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
    sweep_stale(parent)


def sweep_stale(parent: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove every run directory whose owner process is gone; return what was removed."""
    root = Path(parent or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        _log.warning("cannot list %s to sweep stale run directories", root, exc_info=True)
        return removed
    me = os.geteuid()
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            if entry.is_symlink() or not entry.is_dir() or entry.lstat().st_uid != me:
                continue
            owner = (entry / OWNER_FILE).read_text().split()
        except OSError:
            continue  # no owner file: not ours to judge
        if len(owner) != 2 or not owner[0].isdigit():
            continue
        if _token(int(owner[0])) == " ".join(owner):
            continue  # the owner is alive
        remove_tree(entry)
        if not entry.exists():
            removed.append(entry)
        else:
            _log.warning("could not remove the stale run directory %s", entry)
    if removed:
        _log.info("removed %d stale run directories of dead hosts", len(removed))
    return removed
