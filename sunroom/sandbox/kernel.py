"""The kernel handle: :class:`AsyncKernel`, a persistent Python process that runs cells.

One kernel is one supervised process tree behind one private socket. Cells run one at a time;
their state persists. Timeouts are enforced from outside: SIGINT, a short grace, then the whole
tree is killed, a fresh kernel is started with the same inputs and host functions, and the
result says ``state_lost``. A kernel that dies (crash, ``os._exit``, out of memory) is reported
the same way. ``async with`` (or :meth:`aclose`) kills and awaits the whole tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self, final

from sunroom.errors import (
    ClosedError,
    ForkError,
    KernelDiedError,
    KernelError,
    KernelStartError,
    McpServerError,
    PackageInstallError,
    ProtocolError,
    UsageError,
)
from sunroom.rpc import schema
from sunroom.rpc.channel import Channel, RemoteError, RpcFailure, cut
from sunroom.rpc.eager import in_task
from sunroom.rpc.messages import RpcError
from sunroom.sandbox import backends, forking
from sunroom.sandbox import inputs as host_inputs
from sunroom.sandbox.backend import Backend, KernelProcess
from sunroom.sandbox.cellclock import CURRENT_CLOCK, CellClock, CellLost
from sunroom.sandbox.codegen import generate
from sunroom.sandbox.files import KernelFiles
from sunroom.sandbox.functions import FunctionRegistry, HostFunction, rpc_error, to_wire
from sunroom.sandbox.launch import Ready, Router, failure_detail, launch
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import KernelNetwork
from sunroom.sandbox.packages import (
    InstalledPackage,
    PackageListing,
    Packages,
    check_timeout,
    installed,
)
from sunroom.sandbox.pool import KernelPool
from sunroom.sandbox.result import CellError, DisplayItem, ExecutionResult, Variable

if TYPE_CHECKING:
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.network.proxy import Connection
    from sunroom.sandbox.template import Template

OutputCallback = Callable[[str, str], None]
"""Called with (stream name, text) as a cell writes output."""


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
        self._network: KernelNetwork | None = None
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
        self._functions: tuple[Callable[..., Any] | HostFunction, ...] = (
            *base_functions,
            *functions,
        )
        self.registry = FunctionRegistry(self._functions)
        self._own_functions = len(self.registry) > len(base_functions)
        self._wrappers = generate(self.registry.functions.values())
        self._toolset = _toolset(mcp)
        self._own_functions = self._own_functions or self._toolset is not None
        self._inputs: dict[str, Any] = {}
        self._file_inputs: dict[str, host_inputs.Resolved] = {}
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
        self._backend: Backend | None = None
        self._proc: KernelProcess | None = None
        self._closing: asyncio.Task[None] | None = None
        self._channel: Channel | None = None
        self._router: Router | None = None
        self._closed = False
        self._running_cell = False
        self._clock: CellClock | None = None
        self.restarts = 0
        self.kernel_info: dict[str, Any] = {}
        self._files = KernelFiles(self)

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the kernel (idempotent). Raises KernelStartError / SandboxUnavailableError."""
        if self._closed:
            raise ClosedError("the kernel is closed")
        if self._channel is not None and not self._channel.closed.done():
            return
        if self._backend is None:
            backend = backends.resolve(self._backend_arg)
            if self._network is not None:
                KernelNetwork.check_backend(backend.name, getattr(backend, "sandbox", None))
            self._backend = backend
        binding = None
        if self._toolset is not None:  # list the MCP tools while the kernel boots
            binding = asyncio.ensure_future(self._toolset.bind())
        try:
            await self._boot(binding)
        finally:
            if binding is not None:
                if not binding.done():
                    binding.cancel()
                await asyncio.wait([binding])
                if not binding.cancelled():
                    binding.exception()  # retrieved: raised by _boot, or moot after its failure

    def _rebind(self) -> None:
        """Rebuild the registry and wrappers with the toolset's current MCP functions."""
        assert self._toolset is not None
        old = self.registry
        self.registry = FunctionRegistry([*self._functions, *self._toolset.functions])
        self._wrappers = generate(
            self.registry.functions.values(), module_docs=self._toolset.module_docs()
        )
        old.close()

    async def _bind_lazy(self) -> McpServerError | None:
        """Bind lazy or changed MCP servers before a cell; the failure, if one failed."""
        assert self._toolset is not None
        assert self._channel is not None
        try:
            if not await self._toolset.bind(lazy=True):
                return None
        except McpServerError as exc:
            return exc
        self._rebind()
        await self._channel.call(
            "install",
            {"source": self._wrappers.source, "exports": list(self._wrappers.exports)},
            check=schema.names,
        )
        return None

    async def _boot(self, binding: asyncio.Future[bool] | None = None) -> None:
        """Launch (or take) a process and install the functions and inputs.

        *binding*, when given, is the MCP toolset's bind running meanwhile; its functions are
        installed with the others.
        """
        assert self._backend is not None
        if self._pool is not None:
            ready = await self._pool.acquire()
        elif self._template is not None:
            ready = await self._template.fork_ready()
        else:
            where = self._inputs_backend()
            mounts = host_inputs.mounts(where, self._file_inputs) + self.packages.mounts(where)
            ready = await launch(
                self._backend,
                limits=self.limits,
                env={**self._env, **self.packages.env(where)},
                mounts=mounts,
                site_bytes=self.packages.max_bytes,
                network=self._network.egress() if self._network is not None else None,
            )
        self._proc, self._channel, self._router = ready.proc, ready.channel, ready.router
        ready.router.on_output = self._on_output
        ready.channel.serve_with(self._serve, eager=True)
        self.kernel_info = ready.info
        try:
            if binding is not None and await binding:
                self._rebind()
            # a template's fork has the template's functions and inputs already
            if self._template is None and self.registry.functions or self._own_functions:
                await self._channel.call(
                    "install",
                    {"source": self._wrappers.source, "exports": list(self._wrappers.exports)},
                    check=schema.names,
                )
            if self._inputs:
                await self._send_bind(self._inputs)
        except BaseException as exc:
            detail = await failure_detail(ready.proc)
            await self._teardown()
            if isinstance(exc, asyncio.CancelledError | KernelError | UsageError | McpServerError):
                raise
            failure = cut(repr(exc), 300)
            raise KernelStartError(f"the kernel did not take its setup: {failure}{detail}") from exc

    async def _teardown(self) -> None:
        """Close the channel and kill the process tree; cancellation-safe.

        The handles are handed to a task of their own before anything is awaited, so a
        caller cancelled at any point cannot leak them: the task runs to its end, and the next
        teardown (``aclose`` again, a restart) waits for it.
        """
        channel, proc = self._channel, self._proc
        self._channel = self._proc = None
        if channel is not None or proc is not None:
            self._closing = asyncio.get_running_loop().create_task(
                _close_handles(channel, proc), name="sunroom-kernel-teardown"
            )
        if self._closing is not None:
            await asyncio.shield(self._closing)

    async def restart(self) -> None:
        """Kill the kernel and start a fresh one with the same inputs and host functions."""
        async with self._lock:
            await self._restart()

    async def _restart(self) -> None:
        await self._teardown()
        self.restarts += 1
        await self._boot()

    async def aclose(self) -> None:
        """Kill the whole process tree and wait for it; stop its MCP servers. Idempotent."""
        self._closed = True
        self.registry.close()
        toolset, self._toolset = self._toolset, None
        try:
            await self._teardown()
        finally:
            if toolset is not None:
                await toolset.aclose()

    @property
    def network(self) -> KernelNetwork | None:
        """The kernel's network policy and what crossed it (None: no network at all)."""
        return self._network

    @property
    def process(self) -> KernelProcess | None:
        """The running process handle (for tests and diagnostics)."""
        return self._proc

    @property
    def running(self) -> bool:
        """Whether the kernel is started and alive: its process up and its channel open."""
        channel, proc = self._channel, self._proc
        return (
            channel is not None and not channel.closed.done() and proc is not None and proc.alive()
        )

    @property
    def files(self) -> KernelFiles:
        """The workdir's files: ``write``, ``read``, ``read_stream``, ``list``, ``delete``.

        See :class:`~sunroom.sandbox.files.KernelFiles`; operations wait for a running cell.
        """
        return self._files

    # -- fork ------------------------------------------------------------------------------

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
        *on_output* receives the copies' streamed output.

        Raises ForkError when the kernel is busy (a cell, a bind, a file transfer) or refuses
        (its code left threads running); UsageError for an *n* outside 1-64 or on a backend
        that cannot fork (a custom backend); KernelStartError when a copy does not come up (no
        copy is left running then); ClosedError after close.
        """
        readies = await self._fork_ready(n)
        return [self._adopt_copy(ready, on_output) for ready in readies]

    async def _fork_ready(self, n: int) -> list[Ready]:
        """Fork into *n* copies and return them ready, not yet adopted (see :meth:`fork`)."""
        if not isinstance(n, int) or isinstance(n, bool):
            raise UsageError("n must be an int")
        if self._lock.locked():
            raise ForkError(
                "cannot fork while the kernel is busy (a cell, a bind or a file transfer runs)"
            )
        async with self._lock:
            await self._ensure()
            assert self._backend is not None
            assert self._proc is not None
            channel, router = self._channel, self._router
            assert channel is not None
            assert router is not None
            family, member = forking.family_of(self._proc, self._backend.name)
            self._proc = member
            try:
                return await forking.fork(
                    channel,
                    router,
                    member,
                    family,
                    backend=self._backend.name,
                    n=n,
                    limits=self.limits,
                )
            except RemoteError as exc:
                why = cut(exc.error.message, 400)
                raise ForkError(f"the kernel refused to fork: {why}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("fork", exc) from None

    def _adopt_copy(self, ready: Ready, on_output: OutputCallback | None) -> AsyncKernel:
        copy = AsyncKernel(
            backend=self._backend_arg, limits=self.limits, env=self._env, packages=self.packages
        )
        copy.registry = self.registry.copy()
        copy._wrappers = self._wrappers
        copy._functions = self._functions
        copy._toolset = self._toolset
        if self._toolset is not None:
            self._toolset.hold()  # the copies call the same MCP servers
        copy._inputs = dict(self._inputs)
        copy._file_inputs = dict(self._file_inputs)
        copy._on_output = on_output
        copy._backend = self._backend
        copy._network = self._network  # the same sandbox, proxy and byte count
        copy._template, copy._own_functions = self._template, self._own_functions
        copy._proc, copy._channel, copy._router = ready.proc, ready.channel, ready.router
        ready.router.on_output = on_output
        ready.channel.serve_with(copy._serve, eager=True)
        copy.kernel_info = ready.info
        return copy

    # -- host functions --------------------------------------------------------------------

    async def _serve(self, method: str, params: Any) -> Any:
        """Serve a request from the kernel; its params were checked by the channel."""
        if method != "call":
            raise RpcFailure(RpcError("MethodNotFound", f"the host does not serve {method!r}"))
        CURRENT_CLOCK.set(self._clock)  # this request's own context (a copy): no reset needed
        try:
            return await self.registry.invoke(params["name"], params["args"])
        except Exception as exc:  # the kernel gets it as an error answer, by type name
            raise RpcFailure(rpc_error(exc)) from None

    # -- cells -----------------------------------------------------------------------------

    async def execute(self, code: str, *, timeout_s: float | None = None) -> ExecutionResult:
        """Run *code* as one cell and return its result; user errors are data, never raised.

        A kernel that breaks the protocol (an answer that is not an execute result, a frame
        over the caps, ...) or fails outside the cell comes back the same way, as a
        ``status="died"`` result saying so, and is restarted. Raises ClosedError after close,
        KernelStartError if a (re)start fails, UsageError for a non-str *code*.
        """
        if not isinstance(code, str):
            raise UsageError("code must be a str")
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise UsageError("timeout_s must be positive")
        async with self._lock:
            if self._closed or self._channel is None or self._channel.closed.done():
                await self._ensure()
            assert self._channel is not None
            assert self._proc is not None
            started = time.perf_counter()
            if self._toolset is not None and self._toolset.pending:
                failed = await self._bind_lazy()
                if failed is not None:
                    error = CellError("McpServerError", str(failed), "")
                    return ExecutionResult(
                        status="error", error=error, duration_s=time.perf_counter() - started
                    )
            params = {
                "code": code,
                "max_output_bytes": self.limits.max_output_bytes,
                "max_display_bytes": self.limits.display_bytes,
            }
            self._running_cell = True
            try:
                call = self._start_cell(code, params)
                clock = CellClock(call, self._proc, timeout, self.limits.interrupt_grace_s)
                self._clock = clock
                try:
                    await call  # the clock interrupts the cell, then gives up on it
                except CellLost:
                    return await self._after_loss(
                        "timeout",
                        CellError(
                            "TimeoutError",
                            f"the cell ran past its {timeout:g} s limit and ignored the "
                            "interrupt; the kernel was restarted",
                            "",
                        ),
                        started,
                    )
                finally:
                    clock.stop()
                    self._clock = None
                return self._to_result(call, started, timed_out=clock.interrupted, timeout=timeout)
            except (ProtocolError, ClosedError, ConnectionError, RemoteError) as exc:
                return await self._after_death(exc, started)
            finally:
                self._running_cell = False

    def _start_cell(self, code: str, params: dict[str, Any]) -> asyncio.Future[Any]:
        """Send the cell: over the channel, or as a Jupyter ``execute_request`` (jupyter)."""
        assert self._channel is not None
        execute_cell = getattr(self._proc, "execute_cell", None)
        if execute_cell is None:
            return self._channel.request("execute", params, check=self._check_execute)
        call: asyncio.Future[Any] = execute_cell(
            code,
            max_output_bytes=self.limits.max_output_bytes,
            max_display_bytes=self.limits.display_bytes,
            on_output=self._on_output,
            closed=self._channel.closed,
        )
        return call

    def _to_result(
        self,
        call: asyncio.Future[Any],
        started: float,
        *,
        timed_out: bool = False,
        timeout: float = 0.0,
    ) -> ExecutionResult:
        raw = call.result()  # raises if the kernel died
        if getattr(self._proc, "execute_cell", None) is not None:
            raw = self._check_execute(raw)  # the channel checks its own answers
        err = raw["error"]
        error = CellError(err["type"], err["message"], err["traceback"]) if err else None
        status: Any = "ok" if error is None else "error"
        if timed_out and error is not None and error.type == "KeyboardInterrupt":
            status = "timeout"
            error = CellError(
                "TimeoutError",
                f"the cell ran past its {timeout:g} s limit and was interrupted "
                "(the kernel's state is kept)",
                error.traceback,
            )
        return ExecutionResult(
            status=status,
            stdout=raw["stdout"],
            stderr=raw["stderr"],
            value=raw["value"],
            error=error,
            duration_s=time.perf_counter() - started,
            truncated_bytes=raw["truncated_bytes"],
            outputs=tuple(DisplayItem(i["data"], i["metadata"]) for i in raw["outputs"]),
            dropped_outputs=raw["dropped_outputs"],
        )

    async def _after_death(self, exc: BaseException, started: float) -> ExecutionResult:
        assert self._proc is not None
        if isinstance(exc, ProtocolError):
            reason = f"the kernel broke the protocol ({cut(str(exc), 300)}) and was killed"
            await self._proc.kill()
        elif isinstance(exc, RemoteError):  # the runtime failed outside the cell: still alive
            failure = f"{cut(exc.error.type, 100)}: {cut(exc.error.message, 300)}"
            reason = f"the kernel failed outside the cell ({failure}) and was killed"
            await self._proc.kill()
        else:
            reason = await self._proc.exit_reason()
        return await self._after_loss(
            "died", CellError("KernelDied", reason + "; it was restarted", ""), started
        )

    async def _after_loss(self, status: Any, error: CellError, started: float) -> ExecutionResult:
        # if the restart fails, the next execute retries the start and raises then
        with contextlib.suppress(KernelError):
            await self._restart()
        return ExecutionResult(
            status=status,
            error=error,
            duration_s=time.perf_counter() - started,
            state_lost=True,
        )

    async def _ensure(self) -> None:
        await in_task()  # (re)starting needs a task; execute may be started eagerly
        if self._closed:
            raise ClosedError("the kernel is closed")
        if self._channel is None or self._channel.closed.done():
            if self._backend is None:
                await self.start()
            else:
                await self._restart()

    def interrupt(self) -> None:
        """Send SIGINT to the running cell (it raises KeyboardInterrupt; state is kept)."""
        if self._running_cell and self._proc is not None:
            self._proc.interrupt()

    # -- variables -------------------------------------------------------------------------

    def _check_names(self, values: Mapping[str, Any]) -> None:
        for name in values:
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
                raise UsageError(f"input name {name!r} must be a public Python identifier")
            if name in self.registry.functions:
                raise UsageError(f"input {name!r} would shadow the host function of that name")

    def _inputs_backend(self) -> str:
        """The backend whose way of placing file inputs applies (a Jupyter kernel's sandbox)."""
        assert self._backend is not None
        name: str = getattr(self._backend, "inputs_backend", self._backend.name)
        return name

    def _resolve_files(self, values: Mapping[str, Any]) -> dict[str, host_inputs.Resolved]:
        """Resolve and check the File/Directory inputs among *values* (UsageError if bad)."""
        found = {
            n: host_inputs.resolve(n, v) for n, v in values.items() if host_inputs.is_file_input(v)
        }
        early = self._pool or self._template
        if found and early is not None:
            ahead = early.backend
            backend = ahead if isinstance(ahead, str) else ahead.name
            if backend not in host_inputs.PATH_BACKENDS:
                raise UsageError(
                    "a pooled kernel (or one from a template) is started before its inputs are "
                    "known, so File and Directory inputs cannot be mounted in it; give them to "
                    "the template, or use a kernel without a pool"
                )
        return found

    async def _send_bind(self, values: Mapping[str, Any]) -> None:
        assert self._channel is not None
        assert self._backend is not None
        plain = {n: v for n, v in values.items() if not host_inputs.is_file_input(v)}
        try:
            wire = {name: to_wire(value) for name, value in plain.items()}
            files = {
                n: host_inputs.file_spec(self._inputs_backend(), self._file_inputs[n])
                for n in values
                if n not in plain
            }
        except TypeError as exc:
            raise UsageError(f"cannot bind: {exc}") from None
        types = {
            name: self._wrappers.type_names[type(v)]
            for name, v in plain.items()
            if type(v) in self._wrappers.type_names
        }
        answer = host_inputs.send_bind(
            self._channel,
            wire,
            types=types,
            files=files,
            max_frame=self.limits.max_frame_bytes,
        )
        try:
            await answer  # UsageError: cannot be sent; ProtocolError: the kernel broke it
        except RemoteError as exc:
            raise KernelError(f"bind failed: {cut(str(exc), 300)}") from None
        except (ClosedError, ConnectionError) as exc:
            raise await self._died("bind", exc) from None

    async def _died(self, what: str, exc: BaseException) -> KernelError | ClosedError:
        """The error for a call cut short by the kernel's death; tears the dead kernel down.

        KernelDiedError (with the exit reason) when the process died; the kernel is started
        afresh on next use.
        """
        if self._closed:
            return ClosedError("the kernel is closed")
        proc = self._proc
        reason = await proc.exit_reason() if proc is not None else str(exc)
        await self._teardown()
        return KernelDiedError(
            f"the kernel died during {what}(): {reason}; it is restarted on next use",
            reason=reason,
        )

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
        self._check_names(values)
        self._require_runtime("inputs")
        async with self._lock:
            files = await asyncio.to_thread(self._resolve_files, values)  # stats, walks
            if files:
                if self._backend is None:
                    self._backend = backends.resolve(self._backend_arg)
                running = self._channel is not None and not self._channel.closed.done()
                name = self._inputs_backend()
                for item in files.values():
                    host_inputs.kernel_path(name, item)  # UsageError for a backend that cannot
                if running and name not in host_inputs.PATH_BACKENDS:
                    raise UsageError(
                        f"the {name} kernel is running and its mounts were fixed when it "
                        "started; pass File and Directory inputs in inputs= (or bind them "
                        "before the kernel is started)"
                    )
                self._file_inputs.update(files)
            await self._ensure()
            await self._send_bind(values)
            self._inputs.update(values)

    def _require_runtime(self, what: str) -> None:
        """UsageError unless the kernel runs sunroom's runtime (not a non-Python Jupyter one)."""
        backend = self._backend or self._backend_arg
        if not isinstance(backend, str) and getattr(backend, "python", True) is False:
            name = getattr(backend, "kernel_name", backend.name)
            raise UsageError(
                f"the {name!r} Jupyter kernel has no sunroom runtime: {what} need a Python kernel"
            )

    async def variables(self) -> list[Variable]:
        """The user's variables: names, type names and short reprs (no values).

        Raises KernelError when the kernel answers with an error, KernelDiedError when it dies
        while answering, ProtocolError when its answer is not a list of variables (the kernel
        is then restarted on next use).
        """
        self._require_runtime("variables")
        async with self._lock:
            await self._ensure()
            assert self._channel is not None
            try:
                rows = await self._channel.call("variables", check=schema.variables)
            except RemoteError as exc:
                raise KernelError(f"variables failed: {cut(str(exc), 300)}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("variables", exc) from None
        return [Variable(r["name"], r["type"], r["repr"]) for r in rows]

    # -- packages --------------------------------------------------------------------------

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
        self._require_runtime("packages")
        params: dict[str, Any] = {"requirements": list(requirements)}
        if timeout_s is not None:
            params["timeout_s"] = check_timeout(timeout_s)
        async with self._lock:
            await self._ensure()
            assert self._channel is not None
            try:
                rows = await self._channel.call("install_packages", params, check=schema.packages)
            except RemoteError as exc:
                raise _install_error(exc) from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("install", exc) from None
        return installed(rows)

    async def list_packages(self) -> PackageListing:
        """The distributions importable in the kernel and where ``install()`` may look.

        Raises KernelError when the kernel answers with an error, KernelDiedError when it dies
        meanwhile.
        """
        self._require_runtime("packages")
        async with self._lock:
            await self._ensure()
            assert self._channel is not None
            try:
                raw = await self._channel.call("list_packages", check=schema.package_listing)
            except RemoteError as exc:
                raise KernelError(f"list_packages failed: {cut(str(exc), 300)}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("list_packages", exc) from None
        return PackageListing(tuple(installed(raw["packages"])), tuple(raw["sources"]))


async def _close_handles(channel: Channel | None, proc: KernelProcess | None) -> None:
    try:
        if channel is not None:
            await channel.aclose()
    finally:
        if proc is not None:
            await proc.kill()


def _install_error(exc: RemoteError) -> Exception:
    """The host error for an ``install_packages`` error answer."""
    message = cut(exc.error.message, 2300)
    if exc.error.type == "PackageInstallError":
        return PackageInstallError(message)
    if exc.error.type in ("ValueError", "TypeError"):
        return UsageError(message)
    return KernelError(f"install failed: {exc.error.type}: {message}")


def _toolset(mcp: Iterable[McpServer] | Toolset) -> Toolset | None:
    """The toolset for ``mcp=`` (None when no server is given); imports the MCP SDK lazily."""
    try:
        from sunroom.mcp.toolset import Toolset  # the mcp SDK is an optional extra
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"mcp= needs the MCP SDK ({exc.name} is missing): pip install 'sunroom[mcp]'"
        ) from None
    if isinstance(mcp, Toolset):
        return mcp
    servers = list(mcp)
    return Toolset(servers) if servers else None
