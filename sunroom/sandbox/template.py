"""Templates: a warm kernel with its setup done, for every kernel made from it.

``Template(setup="import numpy as np, pandas as pd")`` boots one kernel (the *zygote*), runs
the setup in it once, and keeps it idle. On bwrap, every kernel made from the template is a
fork of the zygote, so it starts with the imports done and the inputs bound in milliseconds,
and each is a **tenant of its own**: its own host uid (one of a block leased for the template
when sunroom runs as root), PID, mount, IPC, network and UTS namespaces, a private workdir,
``/tmp`` and ``/dev/shm``, no capability and the full seccomp filter, set up before anything it
runs exists (:mod:`sunroom.prelude.isolation`). Two kernels of one template are as isolated
from each other as two kernels started apart. On backends that cannot give a fork that
isolation (docker, subprocess), each kernel is started on its own and runs the setup (a
:class:`KernelPool` of the template keeps some ready). A kernel from a template that is
restarted (timeout, crash) is made again the same way, so its setup is never lost. Only
``kernel.fork(n)`` copies of one kernel share a trust domain. See docs/fork.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Self, final

from sunroom import tracing
from sunroom.errors import ClosedError, KernelStartError, UsageError
from sunroom.rpc.channel import cut
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend, Tenancy
from sunroom.sandbox.forking import ForkedProcess, tenancy_of
from sunroom.sandbox.functions import HostFunction, as_host_function
from sunroom.sandbox.kernel import AsyncKernel, OutputCallback
from sunroom.sandbox.launch import Ready
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.packages import Packages

if TYPE_CHECKING:
    from sunroom.tracing import Link

WARM_BACKENDS: Final = ("bwrap",)
"""Backends whose template kernels are forks of the zygote (isolated as tenants)."""

DEFAULT_MAX_KERNELS: Final = 64
"""How many kernels of one template may live at once by default (each holds a uid)."""


@final
class _Tenants:
    """The tenant slots of one zygote: which of its uids are held by a live kernel."""

    def __init__(self, tenancy: Tenancy, count: int) -> None:
        self._uids = tenancy.uids
        self._free = list(range(count - 1, -1, -1))

    def take(self, max_kernels: int) -> tuple[int, int | None]:
        """A free slot and its uid (None: the sandbox's own); raises KernelStartError."""
        if not self._free:
            raise KernelStartError(
                f"all {max_kernels} kernels of this template are in use (each has a uid of its "
                "own); close one, or make the template with a larger max_kernels="
            )
        slot = self._free.pop()
        return slot, self._uids[slot] if self._uids is not None else None

    def give_back(self, slot: int) -> None:
        """*slot*'s kernel is gone (every process of it): its uid may be used again."""
        self._free.append(slot)


@final
class Template:
    """A warm kernel to fork kernels from. Use ``async with Template(...) as t``.

    Args:
        setup: code run once in the template's kernel (imports, loading data). If it fails,
            :meth:`start` raises KernelStartError with the cell's error.
        backend, functions, inputs, limits, env: as for :class:`AsyncKernel`; every kernel
            from the template has them (any built-in backend: kernels that fork).
        packages: as for :class:`AsyncKernel`; the setup may call ``install()``, and every
            kernel from the template sees what it installed (docs/packages.md).
        max_kernels: on bwrap, how many kernels made from the template may live at once
            (default 64): each holds one of the template's uids (leased as a block when
            sunroom runs as root). One more raises KernelStartError until one is closed.
            Kernels started apart (other backends) each lease a uid of their own.

    The template's kernel is started by :meth:`start` (or the first :meth:`kernel`); when it
    has died, the next fork starts it again and runs the setup again (:attr:`restarts`).
    Closing the template does not close the kernels made from it. Like :class:`KernelPool`,
    a template belongs to the event loop it is used on (there is no sync twin).
    """

    def __init__(
        self,
        *,
        setup: str = "",
        backend: str | Backend = backends.DEFAULT_BACKEND,
        functions: Iterable[Callable[..., Any] | HostFunction] = (),
        inputs: Mapping[str, Any] | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        packages: Packages | None = None,
        max_kernels: int = DEFAULT_MAX_KERNELS,
    ) -> None:
        if not isinstance(setup, str):
            raise UsageError("setup must be a str of Python code")
        if not isinstance(max_kernels, int) or isinstance(max_kernels, bool) or max_kernels < 1:
            raise UsageError("max_kernels must be an int of at least 1")
        self.max_kernels = max_kernels
        self.setup = setup
        self.backend = backend
        self.functions: tuple[HostFunction, ...] = tuple(as_host_function(f) for f in functions)
        self.inputs: dict[str, Any] = dict(inputs or {})
        self.limits = limits or Limits()
        self.env = dict(env or {})
        self.packages = packages or Packages()
        self._zygote: AsyncKernel | None = None
        self._tenants: _Tenants | None = None
        self._spare: Ready | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.restarts = 0
        """How many times the template's kernel was started again after it died."""
        self.trace_links: tuple[Link, ...] = ()
        """Span links to the ``sunroom.template`` span of its latest kernel made and set up
        (the zygote on bwrap, the first kernel started apart elsewhere): every kernel made
        from the template links its cells to it (:mod:`sunroom.tracing`)."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def warm(self) -> bool:
        """Whether kernels from the template are forks of its zygote (bwrap) or started apart."""
        name = self.backend if isinstance(self.backend, str) else self.backend.name
        return name in WARM_BACKENDS

    async def start(self) -> None:
        """Start the template's kernel and run the setup (idempotent).

        On a backend that does not fork, a first kernel is started and kept for the first
        :meth:`kernel` (the setup checked). Raises KernelStartError when the setup fails (its
        error in the message), and what :meth:`AsyncKernel.start` raises; ClosedError after
        close.
        """
        async with self._lock:
            if self.warm:
                await self._ensure()
            elif self._spare is None:
                if self._closed:
                    raise ClosedError("the template is closed")
                with tracing.template_span(warm=False, setup_length=len(self.setup)) as span:
                    self._spare = await self._started_apart()
                self.trace_links = tracing.links_to(span)

    def _kernel_with_setup(self) -> AsyncKernel:
        return AsyncKernel(
            backend=self.backend,
            functions=self.functions,
            inputs=self.inputs,
            limits=self.limits,
            env=self.env,
            packages=self.packages,
        )

    async def _run_setup(self, kernel: AsyncKernel) -> None:
        try:
            await kernel.start()
            if self.setup:
                result = await kernel.execute(self.setup)
                if result.error is not None:
                    error = result.error
                    raise KernelStartError(
                        f"the template's setup failed: {error.type}: {cut(error.message, 300)}"
                    )
        except BaseException:
            await kernel.aclose()
            raise

    async def _ensure(self) -> AsyncKernel:
        if self._closed:
            raise ClosedError("the template is closed")
        zygote = self._zygote
        if zygote is not None:
            if zygote.running:
                return zygote
            self._zygote = None
            self._tenants = None  # the old zygote's uids go back with its last kernel
            await zygote.aclose()
            self.restarts += 1
        zygote = self._kernel_with_setup()
        zygote._core.tenants = self.max_kernels  # noqa: SLF001 - launched as a zygote
        with tracing.template_span(warm=True, setup_length=len(self.setup)) as span:
            await self._run_setup(zygote)
        self.trace_links = tracing.links_to(span)
        tenancy = tenancy_of(zygote.process)
        if tenancy is None:
            await zygote.aclose()
            raise KernelStartError("the template's kernel did not start as a zygote")
        self._zygote = zygote
        self._tenants = _Tenants(tenancy, self.max_kernels)
        return zygote

    async def _started_apart(self) -> Ready:
        """A kernel started on its own with the setup run (backends that do not fork)."""
        kernel = self._kernel_with_setup()
        await self._run_setup(kernel)
        return await kernel._surrender()  # noqa: SLF001 - adopted by AsyncKernel(template=)

    async def fork_ready(self) -> Ready:
        """A kernel of the template, ready to be adopted (by ``AsyncKernel(template=)``).

        On bwrap it is a fork of the zygote made a tenant of its own; elsewhere a kernel
        started apart that ran the setup. Raises KernelStartError when the template's
        ``max_kernels`` forks are all alive, or the kernel cannot be made; ClosedError after
        close.
        """
        if not self.warm:
            return await self._apart_ready()
        async with self._lock:
            zygote = await self._ensure()
            tenants = self._tenants
            assert tenants is not None
            slot, uid = tenants.take(self.max_kernels)
            try:
                (ready,) = await zygote._fork_ready(  # noqa: SLF001
                    1, tenants=[uid], share=self.max_kernels + 1
                )
            except BaseException:
                tenants.give_back(slot)
                raise
        assert isinstance(ready.proc, ForkedProcess)
        ready.proc.on_gone.append(lambda: tenants.give_back(slot))
        return ready

    async def _apart_ready(self) -> Ready:
        if self._closed:
            raise ClosedError("the template is closed")
        spare, self._spare = self._spare, None
        return spare if spare is not None else await self._started_apart()

    async def kernel(self, *, on_output: OutputCallback | None = None) -> AsyncKernel:
        """A started kernel forked from the template; the caller closes it."""
        kernel = AsyncKernel(template=self, on_output=on_output)
        await kernel.start()
        return kernel

    async def aclose(self) -> None:
        """Close the template's kernel (kernels made from it live on). Idempotent."""
        self._closed = True
        async with self._lock:
            spare, self._spare = self._spare, None
            if spare is not None:
                await spare.discard()
            if self._zygote is not None:
                await self._zygote.aclose()
                self._zygote = None
