"""The ``subprocess`` backend: a supervised local process. Not a security boundary.

What it does provide: a scrubbed environment, a private working directory removed at close,
rlimits (address space, CPU, file size, open files), cgroup memory/pids/CPU limits when the
cgroup tree is writable, a new session (terminal signals do not reach it) and a supervisor that
reaps and kills every descendant. What it does not: any filesystem, network or process
isolation. Use it for trusted code and development; ask for it by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import site
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, final

import sunroom
from sunroom.errors import KernelStartError
from sunroom.sandbox.backend import KernelProcess, LaunchSpec, kernel_env
from sunroom.sandbox.cgroup import Cgroup
from sunroom.sandbox.process import SupervisedProcess, _remove_tree

BOOT = (
    "import sys, json; sys.path[0:0] = json.loads(sys.argv[1]); "
    "from sunroom.prelude.supervisor import main; main(sys.argv[2])"
)


def package_root() -> str:
    """The directory holding the ``sunroom`` package (put first on the kernel's sys.path)."""
    return str(Path(sunroom.__file__).resolve().parent.parent)


@functools.cache
def kernel_sys_path() -> list[str]:
    """sys.path entries for a kernel started with ``-I -S``: sunroom, then site-packages.

    Starting without ``site`` saves ~20 ms per kernel. Site-packages directories and the plain
    directory lines of their ``.pth`` files are added; ``.pth`` lines that run code (``import``)
    are not executed, so packages relying on start-up hooks need ``import site`` in a cell.
    """
    entries = [package_root()]
    for d in site.getsitepackages():
        if not os.path.isdir(d) or d in entries:
            continue
        entries.append(d)
        for pth in sorted(Path(d).glob("*.pth")):
            try:
                lines = pth.read_text().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.join(d, line)
                if os.path.isdir(path) and path not in entries:
                    entries.append(path)
    return entries


@final
class SubprocessBackend:
    """Launch kernels as supervised local processes of ``sys.executable``."""

    name = "subprocess"

    def __init__(self, *, python: str | None = None, use_cgroups: bool = True) -> None:
        self._python = python or sys.executable
        self._use_cgroups = use_cgroups

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        """Start the supervisor and kernel; see ``Backend.launch``."""
        limits = spec.limits
        rundir = Path(tempfile.mkdtemp(prefix="sunroom-"))
        workdir = rundir / "work"
        workdir.mkdir(mode=0o700)
        host_sock, kernel_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        status_r, status_w = os.pipe()
        cgroup = None
        if self._use_cgroups:
            cgroup = await asyncio.to_thread(
                Cgroup.create,
                f"sunroom-{spec.nonce[:16]}",
                memory_mb=limits.memory_mb,
                pids=limits.pids,
                cpu_quota=limits.cpu_quota,
            )
        config: dict[str, Any] = {
            "fd": kernel_sock.fileno(),
            "status_fd": status_w,
            "nonce": spec.nonce,
            "parent_pid": os.getpid(),
            "max_frame": limits.max_frame_bytes,
            "rlimits": limits.rlimits(),
            "cgroup_procs": cgroup.procs_files if cgroup else [],
        }
        try:
            with open(rundir / "kernel.log", "wb") as log:  # noqa: ASYNC230 - a local create
                proc = await asyncio.create_subprocess_exec(
                    self._python,
                    "-I",
                    "-S",
                    "-c",
                    BOOT,
                    json.dumps(kernel_sys_path()),
                    json.dumps(config),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log,
                    pass_fds=(kernel_sock.fileno(), status_w),
                    cwd=workdir,
                    env=kernel_env(workdir, spec.env),
                    start_new_session=True,
                )
        except OSError as exc:
            host_sock.close()
            os.close(status_r)
            if cgroup is not None:
                cgroup.remove()
            _remove_tree(rundir)
            raise KernelStartError(f"cannot start {self._python}: {exc}") from exc
        finally:
            kernel_sock.close()
            with contextlib.suppress(OSError):
                os.close(status_w)
        handle = SupervisedProcess(
            proc,
            status_fd=status_r,
            rundir=rundir,
            workdir=workdir,
            cgroup=cgroup,
            memory_mb=limits.memory_mb,
        )
        return handle, host_sock
