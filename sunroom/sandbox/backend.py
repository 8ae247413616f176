"""The backend seam: a backend launches a supervised kernel process and hands back a socket.

Every backend (``subprocess``, ``bwrap``, ``docker``) implements :class:`Backend`. The kernel
handle above it (:class:`~sunroom.sandbox.kernel.AsyncKernel`) speaks only this seam: it never
knows how the process was isolated. A backend that cannot provide its boundary raises
:class:`~sunroom.errors.SandboxUnavailableError` with what to install or enable; it never falls
back to a weaker one.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
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
    then has its ``ipc_dir`` set (the IPC directory as the host sees it). A backend that
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


class ExecuteCell(Protocol):
    """Runs a cell without the channel's ``execute`` (a Jupyter kernel's ``execute_request``).

    The future gets the execute result, unchecked (the kernel checks it as the channel checks
    its answers); it
    fails with ConnectionError when *closed* (the kernel's channel) completes first.
    """

    def __call__(
        self,
        code: str,
        *,
        max_output_bytes: int,
        max_display_bytes: int,
        on_output: Callable[[str, str], None] | None,
        closed: asyncio.Future[None],
    ) -> asyncio.Future[object]:
        """Send the cell; the future gets its execute result."""
        ...


@runtime_checkable
class KernelProcess(Protocol):
    """A running, supervised kernel process tree owned by the host.

    The last four members are optional for a backend: :class:`KernelProcessBase` gives their
    defaults (a handle that derives it declares only what it has).
    """

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

    async def log_tail(self) -> str:
        """The kernel's early stderr, shown in a KernelStartError ('' when there is no log)."""
        ...

    @property
    def host_pid(self) -> int | None:
        """The runtime's pid in the host's PID namespace, for taking its open files.

        See :mod:`sunroom.sandbox.fdtake`; None: unknown, and downloads use the channel. Never
        a pid from another namespace (docker's own ``kernel_pid`` is one).
        """
        ...

    @property
    def ipc_dir(self) -> Path | None:
        """A foreign kernel program's IPC directory as the host sees it (``ExecSpec``)."""
        ...

    @property
    def execute_cell(self) -> ExecuteCell | None:
        """How cells run when not as the channel's ``execute`` (a Jupyter kernel's); None."""
        ...


class KernelProcessBase:
    """The defaults of :class:`KernelProcess`'s optional members, for handles to derive.

    As jupyter-client's ``KernelProvisionerBase`` does for provisioners: a handle overrides
    what it has (a log, a host pid, an IPC directory, its own way of running cells).
    """

    ipc_dir: Path | None = None
    """No foreign kernel program: None (a backend that runs one sets it on its handle)."""
    execute_cell: ExecuteCell | None = None
    """Cells run as the channel's ``execute``: None."""

    async def log_tail(self) -> str:
        """No early log: ''."""
        return ""

    @property
    def host_pid(self) -> int | None:
        """Unknown: None."""
        return None


class Backend(Protocol):
    """Launches kernels. Implementations are cheap to build and reusable.

    Only ``name`` and ``launch`` are required; a backend that hosts another kernel program
    (Jupyter) says so through the members of :class:`BackendBase`, which every built-in
    backend derives. :func:`features` reads them (the defaults for a backend that does not
    derive it).
    """

    name: str

    async def launch(self, spec: LaunchSpec) -> tuple[KernelProcess, socket.socket]:
        """Start a supervised kernel; return its handle and the host end of its socket.

        The caller owns both and must ``kill()`` the process. Raises SandboxUnavailableError
        when the boundary cannot be provided and KernelStartError when the launch fails.
        """
        ...


class BackendBase:
    """The optional members of a :class:`Backend`, with their defaults (a sunroom kernel).

    ``python``: whether the kernel runs sunroom's runtime (host functions, inputs, packages);
    ``kernel_name``: what to call the kernel in messages; ``sandbox``: the boundary underneath
    when the backend runs inside another's (None: its own); ``inputs_backend``: the backend
    whose way of placing File and Directory inputs applies.
    """

    name: str

    @property
    def python(self) -> bool:
        """Whether the kernel runs sunroom's runtime: True."""
        return True

    @property
    def kernel_name(self) -> str:
        """The backend's name."""
        return self.name

    sandbox: str | None = None
    """Its own boundary: None."""

    @property
    def inputs_backend(self) -> str:
        """The backend's name."""
        return self.name


def features(backend: Backend) -> BackendBase:
    """*backend*'s optional members: its own, or the defaults (it does not derive BackendBase)."""
    if isinstance(backend, BackendBase):
        return backend
    plain = BackendBase()
    plain.name = backend.name
    return plain


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
