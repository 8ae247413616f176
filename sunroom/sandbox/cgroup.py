"""Per-kernel cgroups (v1 and v2): memory, pids and CPU limits, kill-all, OOM detection.

A :class:`Cgroup` is created under the host process's own cgroup, before the kernel runs; the
host moves the launched process into it (:meth:`Cgroup.add`) while that process still waits at
a gate (a shell's, or the supervisor's own), before any process of the kernel is forked, so
every process that runs the kernel's code is inside from its start. Where the tree is not
writable, :meth:`Cgroup.create` returns None and the caller decides whether that is
acceptable (the isolated backends refuse).

Each cgroup is named after the host process that made it (:func:`cgroup_name`). A host that
dies (``kill -9``, an OOM kill) cannot remove its kernels' cgroups: their processes die with
it, but the empty directories stay, and on cgroup v1 every later migration and start pays
for them (thousands left by killed hosts made a 1,000-kernel start 1.5x slower here). The
first launch of every later host process removes, under its own cgroup, each empty one whose
maker is gone (:func:`sweep_orphans_once`); a cgroup that still holds a process is never
removed, nor one whose name names no maker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

ROOT: Final = Path("/sys/fs/cgroup")
V1_CONTROLLERS: Final = ("memory", "pids", "cpu")
_NAMED: Final = re.compile(r"sunroom-(\d+)-[0-9a-f]+")

_log = logging.getLogger(__name__)
_swept = False
_sweep_lock = threading.Lock()


def cgroup_name(nonce: str) -> str:
    """A kernel's (or copy's) cgroup name: ``sunroom-<this process's pid>-<nonce[:16]>``."""
    return f"sunroom-{os.getpid()}-{nonce[:16]}"


def _bases() -> list[Path]:
    """The directories this process's kernels' cgroups are made in (one per v1 controller)."""
    own = _own_paths()
    ver = version()
    if ver == 2:
        return [ROOT / own.get("", "/").lstrip("/")]
    if ver == 1:
        found = []
        for ctrl in V1_CONTROLLERS:
            base = ROOT / ctrl / own.get(ctrl, "/").lstrip("/")
            found.append(base if base.is_dir() else ROOT / ctrl)
        return found
    return []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, as another user
        return False
    return False


def sweep_orphans() -> int:
    """Remove the empty cgroups (named by :func:`cgroup_name`) whose maker is gone.

    Only under this process's own cgroup; a cgroup with a process in it, or made by a live
    process (or by one whose pid was reused since), is left. Returns how many directories
    were removed. Never raises.
    """
    removed = 0
    me = os.getpid()
    for base in _bases():
        try:
            entries = list(base.iterdir())
        except OSError:
            continue
        for entry in entries:
            named = _NAMED.fullmatch(entry.name)
            if named is None or int(named.group(1)) == me or not _gone(int(named.group(1))):
                continue
            try:
                entry.rmdir()  # refused (EBUSY) while a process is in it
                removed += 1
            except OSError:
                continue
    if removed:
        _log.info("removed %d empty cgroups left by host processes that are gone", removed)
    return removed


def sweep_orphans_once() -> None:
    """:func:`sweep_orphans`, the first time this process calls it."""
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
    sweep_orphans()


def _own_paths() -> dict[str, str]:
    """Controller → this process's cgroup path ('' key for the v2 unified hierarchy)."""
    out: dict[str, str] = {}
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(",") if ctrls else [""]:
            out[ctrl] = path
    return out


def version() -> int | None:
    """1 or 2 for the hierarchy in use, None when there is no usable cgroup mount."""
    if (ROOT / "cgroup.controllers").exists():
        return 2
    if (ROOT / "memory" / "cgroup.procs").exists():
        return 1
    return None


@final
@dataclass
class Cgroup:
    """One kernel's cgroup directories (one per controller on v1, one on v2)."""

    version: int
    dirs: list[Path]
    memory_dir: Path | None
    procs_files: list[str] = field(default_factory=list)

    @classmethod
    def create(
        cls, name: str, *, memory_mb: int | None, pids: int | None, cpu_quota: float | None
    ) -> Cgroup | None:
        """Create the cgroup with its limits; None if the tree is missing or read-only."""
        ver = version()
        try:
            if ver == 2:
                return cls._create_v2(name, memory_mb, pids, cpu_quota)
            if ver == 1:
                return cls._create_v1(name, memory_mb, pids, cpu_quota)
        except OSError:
            return None
        return None

    @classmethod
    def _create_v1(
        cls, name: str, memory_mb: int | None, pids: int | None, cpu_quota: float | None
    ) -> Cgroup:
        own = _own_paths()
        made: list[Path] = []
        mem_dir: Path | None = None
        # the memory controller always (out-of-memory kills are read there); the others only
        # with a limit to set: on v1 each controller is one more migration per process moved,
        # and each migration waits for an RCU grace period
        wanted = [
            c
            for c in V1_CONTROLLERS
            if c == "memory" or (c == "pids" and pids is not None) or (c == "cpu" and cpu_quota)
        ]
        try:
            for ctrl in wanted:
                base = ROOT / ctrl / own.get(ctrl, "/").lstrip("/")
                if not base.is_dir():
                    base = ROOT / ctrl
                d = base / name
                d.mkdir(mode=0o755)
                made.append(d)
                if ctrl == "memory":
                    mem_dir = d
                    if memory_mb is not None:
                        (d / "memory.limit_in_bytes").write_text(str(memory_mb * 1024 * 1024))
                        with contextlib.suppress(OSError):  # no swap accounting: fine
                            (d / "memory.memsw.limit_in_bytes").write_text(
                                str(memory_mb * 1024 * 1024)
                            )
                elif ctrl == "pids" and pids is not None:
                    (d / "pids.max").write_text(str(pids))
                elif ctrl == "cpu" and cpu_quota is not None:
                    (d / "cpu.cfs_period_us").write_text("100000")
                    (d / "cpu.cfs_quota_us").write_text(str(int(cpu_quota * 100000)))
        except OSError:
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        return cls(1, made, mem_dir, [str(d / "cgroup.procs") for d in made])

    @classmethod
    def _create_v2(
        cls, name: str, memory_mb: int | None, pids: int | None, cpu_quota: float | None
    ) -> Cgroup:
        own = _own_paths().get("", "/")
        parent = ROOT / own.lstrip("/")
        wanted = [c for c, on in (("memory", memory_mb), ("pids", pids), ("cpu", cpu_quota)) if on]
        available = set((parent / "cgroup.controllers").read_text().split())
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        missing = [c for c in wanted if c not in enabled]
        if missing and not set(missing) <= available:
            raise OSError("cgroup controllers unavailable")
        if missing:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
        d = parent / name
        d.mkdir(mode=0o755)
        try:
            if memory_mb is not None:
                (d / "memory.max").write_text(str(memory_mb * 1024 * 1024))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
            if pids is not None:
                (d / "pids.max").write_text(str(pids))
            if cpu_quota is not None:
                (d / "cpu.max").write_text(f"{int(cpu_quota * 100000)} 100000")
        except OSError:
            d.rmdir()
            raise
        return cls(2, [d], d, [str(d / "cgroup.procs")])

    def add(self, pid: int) -> None:
        """Move process *pid* into the cgroup (every controller); raises OSError if refused."""
        for procs in self.procs_files:
            with open(procs, "w") as f:
                f.write(str(pid))

    def pids(self) -> set[int]:
        """Every pid currently in the cgroup."""
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel OOM killer has killed in this cgroup."""
        if self.memory_dir is None:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.memory_dir / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill_all(self, deadline_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty; True if it emptied."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        return not self.pids()

    def remove(self) -> None:
        """Kill what is left and remove the directories (best effort, never raises)."""
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
