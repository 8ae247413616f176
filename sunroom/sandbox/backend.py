"""The backend seam: a backend launches a supervised kernel process and hands back a socket.

Every backend (``subprocess``, ``bwrap``, ``docker``) implements :class:`Backend`. The kernel
handle above it (:class:`~sunroom.sandbox.kernel.AsyncKernel`) speaks only this seam: it never
knows how the process was isolated. A backend that cannot provide its boundary raises
:class:`~sunroom.errors.SandboxUnavailableError` with what to install or enable; it never falls
back to a weaker one.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sunroom.sandbox.limits import Limits

if TYPE_CHECKING:
    from sunroom.sandbox.network import Egress

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class InputMount:
    """A host path (already resolved and checked) mounted read-only at *target* in the kernel."""

    source: str
    target: str


DEFAULT_SITE_BYTES = 512 * 2**20
"""Size of a kernel's writable site dir (``$SUNROOM_SITE``) when its Packages name none."""
SITE_ENV = "SUNROOM_SITE"
"""The environment variable through which a backend tells the kernel its site dir."""
KERNEL_SITE = "/site"
"""Where the sandboxing backends (bwrap, docker) put the site dir: a tmpfs of ``site_bytes``."""

IPC_TOKEN = "{ipc}"
"""Replaced, in an :class:`ExecSpec`'s argv, env and files, by the kernel-side IPC directory."""
PYTHON_TOKEN = "{python}"
"""Replaced, as an :class:`ExecSpec`'s ``argv[0]``, by the backend's interpreter as the kernel
sees it (and the kernel's ``PYTHONPATH`` then reaches sunroom and its site-packages)."""


@dataclass(frozen=True, slots=True)
class Tenancy:
    """What a zygote (a template's kernel, ``LaunchSpec.tenants``) gives its isolated copies.

    ``uids``: the copies' uids inside the zygote's user namespace, each mapped to a leased host
    uid of its own (None: sunroom runs unprivileged, and every copy keeps the one host uid
    the user has, as every kernel it starts does). ``count``: how many copies may live at
    once; the per-user limits the host kernel also charges to the zygote's own uid (inotify,
    fanotify, queued signals, message-queue bytes, locked memory, processes) are split into
    ``count + 1`` equal shares, so no copy can spend another's.
    """

    uids: range | None
    count: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecSpec:
    """A foreign kernel program the supervisor runs instead of sunroom's runtime (Jupyter).

    The backend creates an IPC directory private to the kernel's uid, shared between host and
    kernel (Unix sockets live there: a kernel with no network still talks to its client),
    writes *files* into it (readable by the kernel's uid only; see
    :func:`sunroom.sandbox.process.make_ipc_dir`), and the supervisor execs
    *argv* as the kernel. :data:`IPC_TOKEN` in argv, env values and file contents becomes the
    directory's path as the kernel sees it; ``argv[0] == PYTHON_TOKEN`` becomes the backend's
    interpreter. With *attach*, the program attaches to the sunroom channel itself (the
    ``sunroom.prelude.ipython`` extension: it says hello and serves the channel); without it,
    the supervisor runs :mod:`sunroom.prelude.keeper` beside the program, which says hello
    for it and refuses every request.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    attach: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchSpec:
    """What a backend needs to start one kernel.

    ``mounts`` are file inputs (:mod:`sunroom.sandbox.inputs`): a backend that isolates the
    filesystem must mount each read-only at its target, or refuse to launch. ``program``, when
    set, is a foreign kernel program to run instead of sunroom's runtime; the process handle
    then has an ``ipc_dir`` attribute (the IPC directory as the host sees it). A backend that
    cannot run one raises SandboxUnavailableError.

    ``network``, when set, is a network policy: the backend opens the kernel's egress proxy
    (:meth:`~sunroom.sandbox.network.Egress.open`) in a directory it binds into the sandbox,
    lets ``AF_INET`` stream sockets through its seccomp filter, has the supervisor forward
    ``127.0.0.1`` to the proxy, and adds the proxy to the process handle's ``companions``.
    A backend that cannot enforce a policy raises SandboxUnavailableError.
    ``site_bytes`` caps the kernel's writable
    site dir (:mod:`sunroom.prelude.packages`), which the backend makes and names in
    ``$SUNROOM_SITE``.
    """

    limits: Limits
    nonce: str
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[InputMount, ...] = ()
    program: ExecSpec | None = None
    network: Egress | None = None
    site_bytes: int = DEFAULT_SITE_BYTES
    tenants: int = 0
    """Launch a zygote for up to this many isolated copies at once (a template's kernel; see
    :mod:`sunroom.prelude.isolation`); 0 for a kernel. A backend that cannot isolate a
    kernel's copies from each other raises SandboxUnavailableError."""


@runtime_checkable
class KernelProcess(Protocol):
    """A running, supervised kernel process tree owned by the host."""

    @property
    def workdir(self) -> Path:
        """The kernel's working directory as the host sees it."""
        ...

    def adopt(self, kernel_pid: int) -> None:
        """Record the runtime's pid from its hello (as the kernel sees it)."""
        ...

    def interrupt(self) -> None:
        """Deliver SIGINT to the kernel runtime, from outside the sandbox."""
        ...

    def alive(self) -> bool:
        """Whether the process tree is still running."""
        ...

    async def kill(self) -> None:
        """Kill the whole tree, wait for it and release every resource. Idempotent."""
        ...

    async def exit_reason(self) -> str:
        """After the tree has died: how (exit status, signal, out of memory), for humans."""
        ...

    # Optional: ``async def log_tail(self) -> str`` — the kernel's early stderr, shown in a
    # KernelStartError. Backends that have no such log may leave it out.
    # Optional: ``host_pid: int | None`` — the runtime's pid in the host's PID namespace, for
    # taking its open files (:mod:`sunroom.sandbox.fdtake`); without it downloads use the
    # channel. Never a pid from another namespace (docker's own ``kernel_pid`` is one).


class Backend(Protocol):
    """Launches kernels. Implementations are cheap to build and reusable."""

    name: str

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        """Start a supervised kernel; return its handle and the host end of its socket.

        The caller owns both and must ``kill()`` the process. Raises SandboxUnavailableError
        when the boundary cannot be provided and KernelStartError when the launch fails.
        """
        ...


def kernel_env(workdir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The scrubbed environment every kernel starts with: nothing of the host's own."""
    env = {
        "PATH": SAFE_PATH,
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(extra)
    return env
