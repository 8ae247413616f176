"""The ``subprocess`` backend: a supervised local process. Not a security boundary.

What it does provide: a scrubbed environment, a private working directory removed at close,
rlimits (address space, CPU, file size, open files), cgroup memory/pids/CPU limits when the
cgroup tree is writable, a new session (terminal signals do not reach it) and a supervisor that
reaps and kills every descendant. When sunroom runs as root, each kernel runs as its own
unprivileged uid (:mod:`sunroom.sandbox.identity`), never as root; the interpreter and the code
must then be readable by other users. What it does not: any filesystem, network or process
isolation. Use it for trusted code and development; ask for it by name.
"""

from __future__ import annotations

import functools
import os
import site
import socket
import sys
from pathlib import Path
from typing import final

import msgpack

from sunroom.errors import SandboxUnavailableError
from sunroom.sandbox.backend import SITE_ENV, KernelProcess, LaunchSpec, kernel_env
from sunroom.sandbox.identity import lease_if_root_off_loop, require_reachable
from sunroom.sandbox.process import LocalLaunch

BOOT = (
    "import sys; n = int(sys.argv[1]); sys.path[0:0] = sys.argv[2 : 2 + n]; "
    "from sunroom.prelude.boot import main; main(sys.argv[2 + n])"
)
"""The supervisor's start line: no json (with the ``re`` and ``enum`` it imports, ~4 ms of a
kernel's start), and msgpack imported lean first (:mod:`sunroom.prelude.boot`);
:func:`boot_argv` gives it its arguments."""


def boot_argv(python: str, sys_path: list[str], config: dict[str, object]) -> list[str]:
    """The argv that starts the supervisor with *config* under *python* (``-I -S``).

    *sys_path* goes first on the kernel's ``sys.path``, one argument per entry; *config* is
    msgpack in hex (:func:`sunroom.prelude.supervisor.main`).
    """
    config_hex = msgpack.packb(config).hex()
    return [python, "-I", "-S", "-c", BOOT, str(len(sys_path)), *sys_path, config_hex]


def package_root() -> str:
    """The directory holding the ``sunroom`` package (put first on the kernel's sys.path)."""
    return str(Path(__file__).resolve().parents[3])  # .../<root>/sunroom/sandbox/backends/


def installed_in_site() -> bool:
    """Whether sunroom is installed in a site-packages directory (a wheel), not a checkout.

    An installed package's root is site-packages itself, which every kernel needs whole (its
    dependencies sit beside it); a checkout's root is the project, of which a kernel needs
    only the ``sunroom`` directory.
    """
    root = os.path.realpath(package_root())
    return any(os.path.realpath(d) == root for d in site.getsitepackages())


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
        if spec.tenants:
            raise SandboxUnavailableError(
                "subprocess kernels cannot isolate a template's forks from each other; only bwrap "
                "forks a template's kernels (elsewhere each is started apart and runs the setup)"
            )
        limits = spec.limits
        lease = await lease_if_root_off_loop()
        if lease is not None:
            try:
                require_reachable([self._python, sys.base_prefix, *kernel_sys_path()], self.name)
            except BaseException:
                lease.release()
                raise
        local = await LocalLaunch.prepare(
            prefix="sunroom-",
            nonce=spec.nonce,
            limits=limits,
            cgroups=self._use_cgroups,
            lease=lease,
            supervisor_gates=True,
        )
        workdir = local.make_workdir()
        env = kernel_env(workdir, spec.env)
        site = local.rundir / "site"  # its size is checked after each install
        site.mkdir(mode=0o700)
        if lease is not None:
            os.chown(site, lease.identity.uid, lease.identity.gid)
        env[SITE_ENV] = str(site)
        ipc = ""
        if spec.program is not None:
            ipc = str(local.make_ipc_dir(spec.program, str(local.rundir / "ipc")))
            env["PYTHONPATH"] = os.pathsep.join(kernel_sys_path())
        config = local.supervisor_config(
            nonce=spec.nonce, limits=limits, program=spec.program, python=self._python, ipc=ipc
        )
        config["parent_pid"] = os.getpid()
        argv = boot_argv(self._python, kernel_sys_path(), config)
        proc, sock = await local.spawn(
            argv, cwd=workdir, env=env, workdir=workdir, memory_mb=limits.memory_mb
        )
        if ipc:
            proc.ipc_dir = Path(ipc)
        return proc, sock
