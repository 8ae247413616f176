"""The kernel handle: :class:`AsyncKernel`, a persistent Python process that runs cells.

One kernel is one supervised process tree behind one private socket. Cells run one at a time;
their state persists. Timeouts are enforced from outside: SIGINT, a short grace, then the whole
tree is killed, a fresh kernel is started with the same inputs and host functions, and the
result says ``state_lost``. A kernel that dies (crash, ``os._exit``, out of memory) is reported
the same way. ``async with`` (or :meth:`aclose`) kills and awaits the whole tree.

A kernel is composed, top to bottom: its options are checked here, then it builds a
:class:`~sunroom.sandbox.kernel_lifecycle.KernelCore` (process, channel, lock; start, restart,
close) and the parts that take it: host functions served
(:mod:`~sunroom.sandbox.kernel_serving`), inputs and variables
(:mod:`~sunroom.sandbox.kernel_inputs`), cells (:mod:`~sunroom.sandbox.kernel_cells`),
packages (:mod:`~sunroom.sandbox.kernel_packages`), fork (:mod:`~sunroom.sandbox.kernel_fork`)
and files (:mod:`~sunroom.sandbox.files`). Its public methods delegate to them; the core
installs the kernel's functions and inputs in every process it boots through the kernel's
:class:`~sunroom.sandbox.kernel_lifecycle.BootSteps`. No part imports this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self, final

from sunroom import tracing
from sunroom.errors import UsageError
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend, InputMount, KernelProcess
from sunroom.sandbox.codegen import generate
from sunroom.sandbox.files import KernelFiles
from sunroom.sandbox.functions import FunctionRegistry, HostFunction
from sunroom.sandbox.kernel_cells import KernelCells
from sunroom.sandbox.kernel_fork import KernelFork
from sunroom.sandbox.kernel_inputs import KernelInputs
from sunroom.sandbox.kernel_lifecycle import BootSteps, KernelCore, OutputCallback, check_runtime
from sunroom.sandbox.kernel_packages import KernelPackages
from sunroom.sandbox.kernel_serving import KernelServing
from sunroom.sandbox.launch import Ready
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import KernelNetwork
from sunroom.sandbox.packages import InstalledPackage, PackageListing, Packages
from sunroom.sandbox.pool import KernelPool
from sunroom.sandbox.result import ExecutionResult, Variable
from sunroom.sandbox.sources import TemplateSource
from sunroom.sandbox.toolset import Server, Toolset, toolset_for

if TYPE_CHECKING:
    from sunroom.network.policy import Network
    from sunroom.network.proxy import Connection
    from sunroom.tracing import Link

__all__ = ["AsyncKernel", "OutputCallback"]


@final
class AsyncKernel:
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
        template: TemplateSource | None = None,
        mcp: Iterable[Server] | Toolset = (),
        network: Network | None = None,
        on_connection: Callable[[Connection], None] | None = None,
        packages: Packages | None = None,
    ) -> None:
        if template is not None and pool is not None:
            raise UsageError("a kernel comes from a pool or from a template, not both")
        if pool is not None and pool.template is not None:
            template = pool.template  # the pool keeps forks of it ready
        self._template = template
        if template is not None:
            backend, limits, env, packages = _from_template(template, limits, env, packages, inputs)
        elif pool is not None:
            backend, limits, env = _from_pool(pool, limits, env, packages)
        kernel_network = _network(network, on_connection, backend, early=pool or template)
        if packages is not None and not isinstance(packages, Packages):
            raise UsageError("packages must be a sunroom.Packages")
        self.packages = packages or Packages()
        self.limits = limits or Limits()
        if not isinstance(self.limits, Limits):
            raise UsageError("limits must be a sunroom.Limits")
        self._core = KernelCore(
            backend=backend,
            source=pool.acquire if pool is not None else _forks_of(template),
            network=kernel_network,
            limits=self.limits,
            env=dict(env or {}),
            packages=self.packages,
            on_output=on_output,
            steps=self._steps(),
        )
        if template is not None:  # its cells link to where the template's kernel was made
            self._core.trace_links = template.trace_links
        base: tuple[HostFunction, ...] = template.functions if template is not None else ()
        every: tuple[Callable[..., Any] | HostFunction, ...] = (*base, *functions)
        registry = FunctionRegistry(every)
        wrappers = generate(registry.functions.values())
        toolset = toolset_for(mcp)
        serving = KernelServing(
            self._core,
            every,
            registry=registry,
            wrappers=wrappers,
            toolset=toolset,
            own=len(registry) > len(base) or toolset is not None,
        )
        self._assemble(serving, KernelInputs(self._core, serving, early=pool or template))
        if inputs:
            self._inputs.take(inputs)
        if (serving.own or self._inputs.values or self._inputs.files) and not isinstance(
            backend, str
        ):
            check_runtime(backend, "host functions, MCP servers and inputs")

    def _assemble(self, serving: KernelServing, inputs: KernelInputs) -> None:
        """Build the parts that take the core (and the served functions and inputs given)."""
        core = self._core
        self._serving = serving
        self._inputs = inputs
        self._cells = KernelCells(core, serving)
        self._packages = KernelPackages(core)
        self._fork = KernelFork(core)
        self._files = KernelFiles(core)

    def _steps(self) -> BootSteps:
        return BootSteps(
            serve=self._serve, mounts=self._mounts, prepare=self._prepare, install=self._install
        )

    # -- what the core gives every process it boots ---------------------------------------------

    def _serve(self, method: str, params: object) -> Awaitable[object]:
        return self._serving.serve(method, params)

    def _mounts(self, where: str) -> tuple[InputMount, ...]:
        return self._inputs.mounts(where)

    def _prepare(self) -> asyncio.Future[bool] | None:
        return self._serving.prepare()

    async def _install(self, binding: asyncio.Future[bool] | None) -> None:
        """Install the host functions and bind the inputs in a fresh process.

        A template's fork has the template's functions and inputs already.
        """
        await self._serving.install(binding, forked=self._template is not None)
        if self._inputs.values:
            await self._inputs.send_bind(self._inputs.values)

    # -- life -----------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the kernel (idempotent). Raises KernelStartError / SandboxUnavailableError."""
        await self._core.start()

    async def restart(self) -> None:
        """Kill the kernel and start a fresh one with the same inputs and host functions."""
        async with self._core.lock:
            await self._core.restart()

    async def aclose(self) -> None:
        """Kill the whole process tree and wait for it; stop its MCP servers. Idempotent."""
        self._core.closed = True
        toolset = self._serving.release()
        try:
            await self._core.teardown()
        finally:
            if toolset is not None:
                await toolset.aclose()

    async def _surrender(self) -> Ready:
        """Hand this started kernel's process over, to be adopted by another handle; close this.

        What a template on a backend that does not fork hands out (the kernel was started,
        given the template's functions and inputs, and ran its setup). Raises ClosedError
        when the kernel is not running.
        """
        ready = await self._core.surrender()
        await self.aclose()
        return ready

    # -- state ----------------------------------------------------------------------------------

    @property
    def trace_links(self) -> tuple[Link, ...]:
        """The span links of this kernel's cells: to the fork or template it came from.

        Empty for a kernel started on its own, or without OpenTelemetry (:mod:`sunroom.tracing`).
        """
        return self._core.trace_links

    @property
    def network(self) -> KernelNetwork | None:
        """The kernel's network policy and what crossed it (None: no network at all)."""
        return self._core.network

    @property
    def process(self) -> KernelProcess | None:
        """The running process handle (for tests and diagnostics)."""
        return self._core.proc

    @property
    def running(self) -> bool:
        """Whether the kernel is started and alive: its process up and its channel open."""
        return self._core.running

    @property
    def restarts(self) -> int:
        """How many times the kernel was started afresh (a restart, a timeout, a death)."""
        return self._core.restarts

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The running kernel's hello (its pid, protocol; a Jupyter kernel's info)."""
        return self._core.info

    @property
    def registry(self) -> FunctionRegistry:
        """The host functions the kernel serves (replaced by a session for a forked copy)."""
        return self._serving.registry

    @registry.setter
    def registry(self, registry: FunctionRegistry) -> None:
        self._serving.registry = registry

    @property
    def on_output(self) -> OutputCallback | None:
        """Where cells' output goes as they write it, ``(stream, text)``, on the kernel's loop.

        Settable: a session sets it on a forked copy it takes over.
        """
        return self._core.on_output

    @on_output.setter
    def on_output(self, on_output: OutputCallback | None) -> None:
        self._core.on_output = on_output
        if self._core.router is not None:
            self._core.router.on_output = on_output

    @property
    def files(self) -> KernelFiles:
        """The workdir's files: ``write``, ``read``, ``read_stream``, ``list``, ``delete``.

        See :class:`~sunroom.sandbox.files.KernelFiles`; operations wait for a running cell.
        """
        return self._files

    # -- cells ----------------------------------------------------------------------------------

    async def execute(
        self, code: str, *, timeout_s: float | None = None, filename: str | None = None
    ) -> ExecutionResult:
        """Run *code* as one cell and return its result; user errors are data, never raised.

        *filename* names the code in tracebacks and SyntaxErrors (default ``<cell-N>``, N the
        kernel's count of cells; Jupyter kernels name cells themselves and ignore it).

        A kernel that breaks the protocol (an answer that is not an execute result, a frame
        over the caps, ...) or fails outside the cell comes back the same way, as a
        ``status="died"`` result giving the reason, and is restarted (``state_lost``). Raises
        ClosedError after close, KernelStartError if a (re)start fails, UsageError for a non-str
        *code* or one over ``Limits.max_code_bytes`` (checked before anything is sent).
        """
        return await self._cells.execute(code, timeout_s=timeout_s, filename=filename)

    def interrupt(self) -> None:
        """Send SIGINT to the running cell (it raises KeyboardInterrupt; state is kept)."""
        self._cells.interrupt()

    # -- inputs ---------------------------------------------------------------------------------

    async def bind(self, **values: Any) -> None:
        """Set variables in the namespace; they are bound again after every restart.

        Values must be msgpack-representable (str, bytes, numbers, bool, None, lists, dicts,
        pydantic models and dataclasses), of any size (big ones are streamed in chunks), or
        :class:`~sunroom.File` / :class:`~sunroom.Directory` inputs. The bwrap and docker
        backends mount file inputs when the kernel starts, so binding one into a running
        kernel of theirs raises UsageError (pass it in ``inputs=``, or bind it before the
        kernel is started: bind() then starts it with the mount). Raises UsageError for bad
        names or values, KernelError when the kernel refuses them, ProtocolError when its
        answer is malformed (the kernel is then restarted on next use).
        """
        await self._inputs.bind(**values)

    async def variables(self) -> list[Variable]:
        """The user's variables: names, type names and short reprs (no values).

        Raises KernelError when the kernel answers with an error, KernelDiedError when it dies
        while answering, ProtocolError when its answer is not a list of variables (the kernel
        is then restarted on next use).
        """
        return await self._inputs.variables()

    # -- packages -------------------------------------------------------------------------------

    async def install(
        self, *requirements: str, timeout_s: float | None = None
    ) -> list[InstalledPackage]:
        """Install pip *requirements* into the kernel's site dir, as ``install()`` in a cell.

        pip runs inside the kernel's sandbox (docs/packages.md) from the wheelhouse or index of
        :attr:`packages` (or the network, when the kernel has one); the import of every
        installed distribution is checked before this returns. Returns what was installed,
        dependencies included. Raises PackageInstallError with pip's reason (no such package,
        import failure, over ``max_bytes`` or ``timeout_s``, nowhere to look): the site dir is
        then as it was. UsageError for a bad requirement; KernelDiedError when the kernel dies
        meanwhile.
        """
        return await self._packages.install(*requirements, timeout_s=timeout_s)

    async def list_packages(self) -> PackageListing:
        """The distributions importable in the kernel and where ``install()`` may look.

        Raises KernelError when the kernel answers with an error, KernelDiedError when it dies
        meanwhile.
        """
        return await self._packages.list_packages()

    # -- fork -----------------------------------------------------------------------------------

    async def fork(
        self, n: int = 1, *, on_output: OutputCallback | None = None
    ) -> list[AsyncKernel]:
        """Copies of this idle kernel's live state, each a kernel of its own (docs/fork.md).

        The copies are made by ``fork()`` of the kernel's runtime: its namespace, imports,
        bound inputs and host-function wrappers are the same memory, copied on write. Each copy
        has its own socket, supervisor, cgroup (where cgroups are used), a copy of the workdir,
        fresh host-function usage counts and the same limits; it lives in this kernel's sandbox
        and outlives this kernel (the sandbox goes with the last of them). A copy that is
        restarted (timeout, crash) starts cold, with this kernel's inputs and functions.
        *on_output* receives the copies' streamed output. The fork is a ``sunroom.fork`` span;
        the copies' cell spans link to it (:mod:`sunroom.tracing`).

        Raises ForkError when the kernel is busy (a cell, a bind, a file transfer) or refuses
        (its code left threads running); UsageError for an *n* outside 1-64 or on a backend
        that cannot fork (a custom backend); KernelStartError when a copy does not come up (no
        copy is left running then); ClosedError after close.
        """
        with tracing.fork_span(copies=n) as span:
            readies = await self._fork.fork_ready(n)
        copies = [self._copy(ready, on_output) for ready in readies]
        links = tracing.links_to(span)
        for copy in copies:
            copy._core.trace_links = links  # noqa: SLF001 - another handle of this class
        return copies

    async def _fork_ready(
        self, n: int, *, tenants: list[int | None] | None = None, share: int = 1
    ) -> list[Ready]:
        """Fork into *n* copies, not yet adopted (a template's tenants; see :meth:`fork`)."""
        return await self._fork.fork_ready(n, tenants=tenants, share=share)

    def _copy(self, ready: Ready, on_output: OutputCallback | None) -> AsyncKernel:
        """Adopt the forked *ready* as a kernel with this one's functions, inputs and limits.

        The copy lives in this kernel's sandbox (the same network, proxy and byte count); a
        copy of a template's kernel is restarted as a fork of the template.
        """
        parent = self._core
        copy = AsyncKernel.__new__(AsyncKernel)
        copy.limits, copy.packages, copy._template = self.limits, self.packages, self._template
        copy._core = core = KernelCore(
            backend=parent.backend_arg,
            source=_forks_of(self._template),
            network=parent.network,
            limits=self.limits,
            env=dict(parent.env),
            packages=self.packages,
            on_output=on_output,
            steps=copy._steps(),
        )
        core.backend = parent.backend
        serving = self._serving.copy_for(core)
        copy._assemble(serving, self._inputs.copy_for(core, serving))
        core.adopt(ready)
        return copy


def _from_template(
    template: TemplateSource,
    limits: Limits | None,
    env: Mapping[str, str] | None,
    packages: Packages | None,
    inputs: Mapping[str, object] | None,
) -> tuple[str | Backend, Limits, dict[str, str], Packages]:
    """A template's kernel's backend, limits, env and packages (UsageError for others given)."""
    if limits is not None and limits != template.limits:
        raise UsageError("a kernel from a template runs with its limits; omit limits=")
    if env is not None and dict(env) != template.env:
        raise UsageError("a kernel from a template runs with its env; omit env=")
    if packages is not None and packages != template.packages:
        raise UsageError("a kernel from a template has its packages; omit packages=")
    clash = sorted(set(inputs or {}) & set(template.inputs))
    if clash:
        raise UsageError(f"input {clash[0]!r} is already bound by the template")
    return template.backend, template.limits, template.env, template.packages


def _from_pool(
    pool: KernelPool,
    limits: Limits | None,
    env: Mapping[str, str] | None,
    packages: Packages | None,
) -> tuple[str | Backend, Limits, dict[str, str]]:
    """A pooled kernel's backend, limits and env (UsageError for others given)."""
    if limits is not None and limits != pool.limits:
        raise UsageError("a pooled kernel runs with its pool's limits; omit limits=")
    if env is not None and dict(env) != pool.env:
        raise UsageError("a pooled kernel runs with its pool's env; omit env=")
    if packages is not None:
        raise UsageError("a pooled kernel is started before its packages are known")
    return pool.backend, pool.limits, pool.env


def _network(
    network: Network | None,
    on_connection: Callable[[Connection], None] | None,
    backend: str | Backend,
    *,
    early: object,
) -> KernelNetwork | None:
    """The kernel's network (None: none); *early*, a pool or template, has none to give."""
    if network is None:
        return None
    if early is not None:
        raise UsageError(
            "a kernel from a template or a pool has its sandbox's network (none); "
            "pass network= to a kernel started on its own"
        )
    if isinstance(backend, str):
        KernelNetwork.check_backend(backend)
    return KernelNetwork(network, on_connection=on_connection)


def _forks_of(template: TemplateSource | None) -> Callable[[], Awaitable[Ready]] | None:
    return template.fork_ready if template is not None else None
