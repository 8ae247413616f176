"""A kernel's core: its process, channel and lock, and their life (start, restart, close).

:class:`KernelCore` is the one object every part of a kernel takes (cells, inputs, host
functions served, packages, fork, files): it boots a process (launched cold, taken from a pool
or forked from a template), has the kernel's :class:`BootSteps` install what the kernel above
it gives every process (its host functions and inputs), tears the process tree down
cancellation-safely, and turns a death during a call into
:class:`~sunroom.errors.KernelDiedError`. It knows nothing of the parts: they depend on it, the
kernel (:class:`~sunroom.sandbox.kernel.AsyncKernel`) depends on them, nothing depends back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from sunroom.errors import (
    ClosedError,
    KernelDiedError,
    KernelError,
    KernelStartError,
    McpServerError,
    UsageError,
)
from sunroom.rpc.channel import Channel, cut
from sunroom.rpc.eager import in_task
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend, InputMount, KernelProcess, features
from sunroom.sandbox.cellclock import CellClock
from sunroom.sandbox.launch import Ready, Router, failure_detail, launch
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import KernelNetwork
from sunroom.sandbox.packages import Packages

if TYPE_CHECKING:
    from sunroom.tracing import Context, Link

OutputCallback = Callable[[str, str], None]
"""Called with (stream name, text) as a cell writes output."""

Serve = Callable[[str, object], Awaitable[object]]
"""Answers a request from the kernel (method, params checked by the channel)."""


@final
@dataclass(frozen=True, slots=True)
class BootSteps:
    """What the kernel above the core gives every process the core boots.

    ``serve`` answers the process's requests (its host-function calls); ``mounts`` are the
    file inputs to mount for a backend that places them as the named one does; ``prepare``
    is begun when the kernel starts, while the process boots (an MCP toolset listing its
    tools; None: nothing to wait for), and its future is handed to ``install``, which gives a
    fresh process its host functions and inputs (raising fails the boot).
    """

    serve: Serve
    mounts: Callable[[str], tuple[InputMount, ...]]
    prepare: Callable[[], asyncio.Future[bool] | None]
    install: Callable[[asyncio.Future[bool] | None], Awaitable[None]]


@final
class KernelCore:
    """One kernel's process, channel, lock and life: what every part of the kernel takes.

    *source*, when given, hands out started processes (a pool's ``acquire``, a template's
    ``fork_ready``) instead of cold launches. The attributes are the parts' to read; the
    process handles (``proc``, ``channel``, ``router``) change only here, under :attr:`lock`.
    """

    def __init__(
        self,
        *,
        backend: str | Backend,
        source: Callable[[], Awaitable[Ready]] | None,
        network: KernelNetwork | None,
        limits: Limits,
        env: dict[str, str],
        packages: Packages,
        on_output: OutputCallback | None,
        steps: BootSteps,
    ) -> None:
        self.backend_arg = backend
        self.source = source
        self.network = network
        self.limits = limits
        self.env = env
        self.packages = packages
        self.on_output = on_output
        self.steps = steps
        self.tenants = 0
        """Launch as a zygote for this many isolated copies (set by a Template); 0: a kernel."""
        self.lock = asyncio.Lock()
        self.backend: Backend | None = None
        self.proc: KernelProcess | None = None
        self.channel: Channel | None = None
        self.router: Router | None = None
        self.closed = False
        self.running_cell = False
        self.clock: CellClock | None = None
        """The running cell's clock (host calls run in its context)."""
        self.trace_context: Context | None = None
        """The running cell's tracing context (host calls' spans are its children)."""
        self.trace_links: tuple[Link, ...] = ()
        """Span links of this kernel's cells: to the fork or template it came from."""
        self.restarts = 0
        self.info: dict[str, Any] = {}
        """The running process's hello."""
        self._closing: asyncio.Task[None] | None = None

    def resolve_backend(self) -> Backend:
        """The backend, resolved from its name on first use."""
        if self.backend is None:
            self.backend = backends.resolve(self.backend_arg)
        return self.backend

    def inputs_backend(self) -> str:
        """The backend whose way of placing file inputs applies (a Jupyter kernel's sandbox)."""
        return features(self.resolve_backend()).inputs_backend

    async def start(self) -> None:
        """Start the kernel (idempotent). Raises KernelStartError / SandboxUnavailableError."""
        if self.closed:
            raise ClosedError("the kernel is closed")
        if self.channel is not None and not self.channel.closed.done():
            return
        if self.backend is None:
            backend = backends.resolve(self.backend_arg)
            if self.network is not None:
                KernelNetwork.check_backend(backend.name, features(backend).sandbox)
            self.backend = backend
        binding = self.steps.prepare()  # e.g. list the MCP tools while the kernel boots
        try:
            await self.boot(binding)
        finally:
            if binding is not None:
                if not binding.done():
                    binding.cancel()
                await asyncio.wait([binding])
                if not binding.cancelled():
                    binding.exception()  # retrieved: raised by boot, or moot after its failure

    async def boot(self, binding: asyncio.Future[bool] | None = None) -> None:
        """Launch (or take) a process and have the kernel's steps install what it gives it.

        *binding*, when given, is what ``steps.prepare`` began, handed to ``steps.install``.
        """
        assert self.backend is not None
        if self.source is not None:
            ready = await self.source()
        else:
            where = self.inputs_backend()
            ready = await launch(
                self.backend,
                limits=self.limits,
                env={**self.env, **self.packages.env(where)},
                mounts=self.steps.mounts(where) + self.packages.mounts(where),
                site_bytes=self.packages.max_bytes,
                network=self.network.egress() if self.network is not None else None,
                tenants=self.tenants,
            )
        self.adopt(ready)
        try:
            await self.steps.install(binding)
        except BaseException as exc:
            detail = await failure_detail(ready.proc)
            await self.teardown()
            if isinstance(exc, asyncio.CancelledError | KernelError | UsageError | McpServerError):
                raise
            failure = cut(repr(exc), 300)
            raise KernelStartError(f"the kernel did not take its setup: {failure}{detail}") from exc

    def adopt(self, ready: Ready) -> None:
        """Take *ready* as this kernel's process: its output routed, its requests served."""
        self.proc, self.channel, self.router = ready.proc, ready.channel, ready.router
        ready.router.on_output = self.on_output
        ready.channel.serve_with(self.steps.serve, eager=True)
        self.info = ready.info

    async def teardown(self) -> None:
        """Close the channel and kill the process tree; cancellation-safe.

        The handles are handed to a task of their own before anything is awaited, so a
        caller cancelled at any point cannot leak them: the task runs to its end, and the next
        teardown (``aclose`` again, a restart) waits for it.
        """
        channel, proc = self.channel, self.proc
        self.channel = self.proc = None
        if channel is not None or proc is not None:
            self._closing = asyncio.get_running_loop().create_task(
                _close_handles(channel, proc), name="sunroom-kernel-teardown"
            )
        if self._closing is not None:
            await asyncio.shield(self._closing)

    async def restart(self) -> None:
        """Tear the process down and boot a fresh one; the caller holds :attr:`lock`."""
        await self.teardown()
        self.restarts += 1
        await self.boot()

    async def surrender(self) -> Ready:
        """Hand this started kernel's process over, to be adopted by another handle.

        The handles are forgotten here (the caller then closes what is left). Raises
        ClosedError when the kernel is not running.
        """
        async with self.lock:
            channel, proc, router = self.channel, self.proc, self.router
            if channel is None or proc is None or router is None or channel.closed.done():
                raise ClosedError("the kernel is not running")
            self.channel = self.proc = self.router = None
            return Ready(proc, channel, router, dict(self.info))

    @property
    def running(self) -> bool:
        """Whether the kernel is started and alive: its process up and its channel open."""
        channel, proc = self.channel, self.proc
        return (
            channel is not None and not channel.closed.done() and proc is not None and proc.alive()
        )

    async def ensure(self) -> None:
        """Start the kernel, or restart it when its channel closed; ClosedError after close."""
        await in_task()  # (re)starting needs a task; execute may be started eagerly
        if self.closed:
            raise ClosedError("the kernel is closed")
        if self.channel is None or self.channel.closed.done():
            if self.backend is None:
                await self.start()
            else:
                await self.restart()

    async def died(self, what: str, exc: BaseException) -> KernelError | ClosedError:
        """The error for a call cut short by the kernel's death; tears the dead kernel down.

        KernelDiedError (with the exit reason) when the process died; the kernel is started
        afresh on next use.
        """
        if self.closed:
            return ClosedError("the kernel is closed")
        proc = self.proc
        reason = await proc.exit_reason() if proc is not None else str(exc)
        await self.teardown()
        return KernelDiedError(
            f"the kernel died during {what}(): {reason}; it is restarted on next use",
            reason=reason,
        )

    def require_runtime(self, what: str) -> None:
        """UsageError unless the kernel runs sunroom's runtime (not a non-Python Jupyter one)."""
        check_runtime(self.backend or self.backend_arg, what)


def check_runtime(backend: str | Backend, what: str) -> None:
    """UsageError when *backend* runs a Jupyter kernel without sunroom's runtime."""
    if isinstance(backend, str):
        return
    described = features(backend)
    if not described.python:
        raise UsageError(
            f"the {described.kernel_name!r} Jupyter kernel has no sunroom runtime: {what} need "
            "a Python kernel"
        )


async def _close_handles(channel: Channel | None, proc: KernelProcess | None) -> None:
    try:
        if channel is not None:
            await channel.aclose()
    finally:
        if proc is not None:
            await proc.kill()
