"""The kernel handle: :class:`AsyncKernel`, a persistent Python process that runs cells.

One kernel is one supervised process tree behind one private socket. Cells run one at a time;
their state persists. Timeouts are enforced from outside: SIGINT, a short grace, then the whole
tree is killed, a fresh kernel is started with the same inputs and host functions, and the
result says ``state_lost``. A kernel that dies (crash, ``os._exit``, out of memory) is reported
the same way. ``async with`` (or :meth:`aclose`) kills and awaits the whole tree.

This module holds the constructor (its options checked); the kernel's parts are mixins, each in
a module of its own: :mod:`~sunroom.sandbox.kernel_lifecycle` (start, restart, close, and the
attributes the parts share), :mod:`~sunroom.sandbox.kernel_cells` (``execute``),
:mod:`~sunroom.sandbox.kernel_inputs` (``bind``, ``variables``),
:mod:`~sunroom.sandbox.kernel_serving` (host functions and MCP tools served),
:mod:`~sunroom.sandbox.kernel_packages` (``install``, ``list_packages``) and
:mod:`~sunroom.sandbox.kernel_fork` (``fork``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, final

from sunroom.errors import UsageError
from sunroom.rpc import schema
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.codegen import generate
from sunroom.sandbox.files import KernelFiles
from sunroom.sandbox.functions import FunctionRegistry, HostFunction
from sunroom.sandbox.kernel_cells import KernelCells
from sunroom.sandbox.kernel_fork import KernelFork
from sunroom.sandbox.kernel_inputs import KernelInputs
from sunroom.sandbox.kernel_lifecycle import OutputCallback
from sunroom.sandbox.kernel_packages import KernelPackages
from sunroom.sandbox.kernel_serving import KernelServing, toolset_for
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import KernelNetwork
from sunroom.sandbox.packages import Packages
from sunroom.sandbox.pool import KernelPool

if TYPE_CHECKING:
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.network.proxy import Connection
    from sunroom.sandbox.template import Template

__all__ = ["AsyncKernel", "OutputCallback"]


@final
class AsyncKernel(KernelCells, KernelInputs, KernelServing, KernelPackages, KernelFork):
    """A persistent, supervised Python kernel. Use ``async with AsyncKernel(...) as k``.

    Args:
        backend: ``"bwrap"`` (default, isolated), ``"docker"``, ``"subprocess"`` (not a
            boundary; must be asked for by name) or a Backend instance.
        functions: host functions (typed callables or ``host_function`` objects), frozen at boot.
        inputs: variables bound in the namespace at every (re)start: values of any size, and
            :class:`~sunroom.File` / :class:`~sunroom.Directory` inputs, mounted read-only
            when the kernel starts (see docs/data.md).
        limits: resource limits; see :class:`Limits`.
        env: extra environment variables for the kernel (the host's own are never passed).
        on_output: called with (stream, text) while a cell runs.
        pool: take started kernels from this :class:`KernelPool` (its backend, limits and env
            apply) instead of starting them cold, at start and at every restart.
        template: start as a fork of this :class:`~sunroom.Template`'s warm kernel (its setup
            done; its backend, limits, env, functions and inputs apply), at start and at every
            restart. *functions* and *inputs* given here are added on top.
        mcp: MCP servers (:func:`sunroom.mcp.stdio`, :func:`sunroom.mcp.http`) whose tools are
            bound as one module per server (``github.search_issues(...)``), called on the host
            like host functions; see ``docs/mcp.md``. Eager servers connect at start (a server
            that cannot raises :class:`~sunroom.errors.McpServerError`), lazy ones before the
            first cell. The servers stop when the kernel (and its last forked copy) closes.
        network: a :class:`~sunroom.Network` policy (bwrap and docker only): the kernel reaches
            the hosts it allows through a proxy on the host, and nothing else; without one it
            has no network at all. See ``docs/network.md``.
        on_connection: called with a :class:`~sunroom.network.Connection` record for every
            connection the kernel's proxy allowed or refused, when it ends.
        packages: where ``install()`` finds packages (wheelhouse directories, an index) and
            its size and time budget; see :class:`~sunroom.Packages` and docs/packages.md.
            A kernel from a template has the template's.
    """

    def __init__(
        self,
        *,
        backend: str | Backend = backends.DEFAULT_BACKEND,
        functions: Iterable[Callable[..., Any] | HostFunction] = (),
        inputs: Mapping[str, Any] | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
        pool: KernelPool | None = None,
        template: Template | None = None,
        mcp: Iterable[McpServer] | Toolset = (),
        network: Network | None = None,
        on_connection: Callable[[Connection], None] | None = None,
        packages: Packages | None = None,
    ) -> None:
        self._pool = pool
        if template is not None and pool is not None:
            raise UsageError("a kernel comes from a pool or from a template, not both")
        if pool is not None and pool.template is not None:
            template = pool.template  # the pool keeps forks of it ready
        self._template = template
        self._tenants = 0
        base_functions: tuple[HostFunction, ...] = ()
        if template is not None:
            if limits is not None and limits != template.limits:
                raise UsageError("a kernel from a template runs with its limits; omit limits=")
            if env is not None and dict(env) != template.env:
                raise UsageError("a kernel from a template runs with its env; omit env=")
            if packages is not None and packages != template.packages:
                raise UsageError("a kernel from a template has its packages; omit packages=")
            limits, env, backend = template.limits, template.env, template.backend
            packages = template.packages
            base_functions = template.functions
            clash = sorted(set(inputs or {}) & set(template.inputs))
            if clash:
                raise UsageError(f"input {clash[0]!r} is already bound by the template")
        elif pool is not None:
            if limits is not None and limits != pool.limits:
                raise UsageError("a pooled kernel runs with its pool's limits; omit limits=")
            if env is not None and dict(env) != pool.env:
                raise UsageError("a pooled kernel runs with its pool's env; omit env=")
            if packages is not None:
                raise UsageError("a pooled kernel is started before its packages are known")
            limits, env, backend = pool.limits, pool.env, pool.backend
        self._backend_arg = backend
        self._network = None
        if network is not None:
            if template is not None or pool is not None:
                raise UsageError(
                    "a kernel from a template or a pool has its sandbox's network (none); "
                    "pass network= to a kernel started on its own"
                )
            if isinstance(backend, str):
                KernelNetwork.check_backend(backend)
            self._network = KernelNetwork(network, on_connection=on_connection)
        if packages is not None and not isinstance(packages, Packages):
            raise UsageError("packages must be a sunroom.Packages")
        self.packages = packages or Packages()
        self.limits = limits or Limits()
        if not isinstance(self.limits, Limits):
            raise UsageError("limits must be a sunroom.Limits")
        self._functions = (
            *base_functions,
            *functions,
        )
        self.registry = FunctionRegistry(self._functions)
        self._own_functions = len(self.registry) > len(base_functions)
        self._wrappers = generate(self.registry.functions.values())
        self._toolset = toolset_for(mcp)
        self._own_functions = self._own_functions or self._toolset is not None
        self._inputs = {}
        self._file_inputs = {}
        if inputs:
            self._check_names(inputs)
            self._file_inputs = self._resolve_files(inputs)
            self._inputs.update(inputs)
        if (
            not isinstance(backend, str)
            and getattr(backend, "python", True) is False
            and (self._own_functions or self._inputs or self._file_inputs)
        ):
            raise UsageError(
                f"the {getattr(backend, 'kernel_name', backend.name)!r} Jupyter kernel has no "
                "sunroom runtime: host functions, MCP servers and inputs need a Python kernel"
            )
        self._env = dict(env or {})
        self._on_output = on_output
        self._check_execute = schema.execute_result(
            self.limits.max_output_bytes, self.limits.display_bytes
        )
        self._lock = asyncio.Lock()
        self._backend = None
        self._proc = None
        self._closing = None
        self._channel = None
        self._router = None
        self._closed = False
        self._running_cell = False
        self._clock = None
        self.restarts = 0
        self.kernel_info = {}
        self._files = KernelFiles(self)
