"""A kernel's life: start, restart, teardown and close, and the state its parts share.

:class:`KernelLifecycle` is the base of :class:`~sunroom.sandbox.kernel.AsyncKernel`: it
declares every attribute the kernel's parts use (set in ``AsyncKernel.__init__``), boots a
process (launched cold, taken from a pool or forked from a template) and installs the host
functions and inputs in it, tears the process tree down cancellation-safely, and turns a death
during a call into :class:`~sunroom.errors.KernelDiedError`. The parts beside it: cells
(:mod:`~sunroom.sandbox.kernel_cells`), inputs and variables
(:mod:`~sunroom.sandbox.kernel_inputs`), host functions served
(:mod:`~sunroom.sandbox.kernel_serving`), packages (:mod:`~sunroom.sandbox.kernel_packages`)
and fork (:mod:`~sunroom.sandbox.kernel_fork`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

from sunroom.errors import (
    ClosedError,
    KernelDiedError,
    KernelError,
    KernelStartError,
    McpServerError,
    UsageError,
)
from sunroom.rpc import schema
from sunroom.rpc.channel import Channel, cut
from sunroom.rpc.eager import in_task
from sunroom.sandbox import backends
from sunroom.sandbox import inputs as host_inputs
from sunroom.sandbox.backend import Backend, KernelProcess
from sunroom.sandbox.cellclock import CellClock
from sunroom.sandbox.codegen import WrapperSource
from sunroom.sandbox.files import KernelFiles
from sunroom.sandbox.functions import FunctionRegistry, HostFunction
from sunroom.sandbox.launch import Ready, Router, failure_detail, launch
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import KernelNetwork
from sunroom.sandbox.packages import Packages
from sunroom.sandbox.pool import KernelPool

if TYPE_CHECKING:
    from sunroom.mcp.toolset import Toolset
    from sunroom.sandbox.template import Template

OutputCallback = Callable[[str, str], None]
"""Called with (stream name, text) as a cell writes output."""


class KernelLifecycle:
    """Start, restart, teardown and close; the attributes every part of a kernel shares."""

    _pool: KernelPool | None
    _template: Template | None
    _tenants: int
    """Launch as a zygote for this many isolated copies (set by a Template); 0: a kernel."""
    _backend_arg: str | Backend
    _network: KernelNetwork | None
    packages: Packages
    limits: Limits
    _functions: tuple[Callable[..., Any] | HostFunction, ...]
    registry: FunctionRegistry
    _own_functions: bool
    _wrappers: WrapperSource
    _toolset: Toolset | None
    _inputs: dict[str, Any]
    _file_inputs: dict[str, host_inputs.Resolved]
    _env: dict[str, str]
    _on_output: OutputCallback | None
    _check_execute: schema.Checker
    _lock: asyncio.Lock
    _backend: Backend | None
    _proc: KernelProcess | None
    _closing: asyncio.Task[None] | None
    _channel: Channel | None
    _router: Router | None
    _closed: bool
    _running_cell: bool
    _clock: CellClock | None
    restarts: int
    kernel_info: dict[str, Any]
    _files: KernelFiles

    if TYPE_CHECKING:  # provided by the other parts of AsyncKernel

        async def _serve(self, method: str, params: Any) -> Any: ...
        def _rebind(self) -> None: ...
        async def _bind_lazy(self) -> McpServerError | None: ...
        def _inputs_backend(self) -> str: ...
        async def _send_bind(self, values: Mapping[str, Any]) -> None: ...

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
                tenants=self._tenants,
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

    async def _surrender(self) -> Ready:
        """Hand this started kernel's process over, to be adopted by another handle; close this.

        What a template on a backend that does not fork hands out (the kernel was started,
        given the template's functions and inputs, and ran its setup). Raises ClosedError
        when the kernel is not running.
        """
        async with self._lock:
            channel, proc, router = self._channel, self._proc, self._router
            if channel is None or proc is None or router is None or channel.closed.done():
                raise ClosedError("the kernel is not running")
            self._channel = self._proc = self._router = None
            ready = Ready(proc, channel, router, dict(self.kernel_info))
        await self.aclose()
        return ready

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

    async def _ensure(self) -> None:
        await in_task()  # (re)starting needs a task; execute may be started eagerly
        if self._closed:
            raise ClosedError("the kernel is closed")
        if self._channel is None or self._channel.closed.done():
            if self._backend is None:
                await self.start()
            else:
                await self._restart()

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

    def _require_runtime(self, what: str) -> None:
        """UsageError unless the kernel runs sunroom's runtime (not a non-Python Jupyter one)."""
        backend = self._backend or self._backend_arg
        if not isinstance(backend, str) and getattr(backend, "python", True) is False:
            name = getattr(backend, "kernel_name", backend.name)
            raise UsageError(
                f"the {name!r} Jupyter kernel has no sunroom runtime: {what} need a Python kernel"
            )


async def _close_handles(channel: Channel | None, proc: KernelProcess | None) -> None:
    try:
        if channel is not None:
            await channel.aclose()
    finally:
        if proc is not None:
            await proc.kill()
