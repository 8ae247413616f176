"""Templates: a warm kernel with its setup done, forked for every kernel made from it.

``Template(setup="import numpy as np, pandas as pd")`` boots one kernel (the *zygote*), runs
the setup in it once, and keeps it idle. Every kernel made from the template is a fork of the
zygote (:meth:`AsyncKernel.fork`), so it starts with the imports done and the inputs bound, in
milliseconds instead of a cold start plus the imports. A kernel from a template that is
restarted (timeout, crash) is forked again, so its setup is never lost. See docs/fork.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self, final

from sunroom.errors import ClosedError, KernelStartError, UsageError
from sunroom.rpc.channel import cut
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.functions import HostFunction, as_host_function
from sunroom.sandbox.kernel import AsyncKernel, OutputCallback
from sunroom.sandbox.launch import Ready
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.packages import Packages


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
    ) -> None:
        if not isinstance(setup, str):
            raise UsageError("setup must be a str of Python code")
        self.setup = setup
        self.backend = backend
        self.functions: tuple[HostFunction, ...] = tuple(as_host_function(f) for f in functions)
        self.inputs: dict[str, Any] = dict(inputs or {})
        self.limits = limits or Limits()
        self.env = dict(env or {})
        self.packages = packages or Packages()
        self._zygote: AsyncKernel | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.restarts = 0
        """How many times the template's kernel was started again after it died."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the template's kernel and run the setup (idempotent).

        Raises KernelStartError when the setup fails (its error in the message), and what
        :meth:`AsyncKernel.start` raises; ClosedError after close.
        """
        async with self._lock:
            await self._ensure()

    async def _ensure(self) -> AsyncKernel:
        if self._closed:
            raise ClosedError("the template is closed")
        zygote = self._zygote
        if zygote is not None:
            if zygote.running:
                return zygote
            self._zygote = None
            await zygote.aclose()
            self.restarts += 1
        zygote = AsyncKernel(
            backend=self.backend,
            functions=self.functions,
            inputs=self.inputs,
            limits=self.limits,
            env=self.env,
            packages=self.packages,
        )
        try:
            await zygote.start()
            if self.setup:
                result = await zygote.execute(self.setup)
                if result.error is not None:
                    error = result.error
                    raise KernelStartError(
                        f"the template's setup failed: {error.type}: {cut(error.message, 300)}"
                    )
        except BaseException:
            await zygote.aclose()
            raise
        self._zygote = zygote
        return zygote

    async def fork_ready(self) -> Ready:
        """A fork of the template's kernel, ready to be adopted (by ``AsyncKernel(template=)``)."""
        async with self._lock:
            zygote = await self._ensure()
            (ready,) = await zygote._fork_ready(1)  # noqa: SLF001 - the kernel's own fork path
            return ready

    async def kernel(self, *, on_output: OutputCallback | None = None) -> AsyncKernel:
        """A started kernel forked from the template; the caller closes it."""
        kernel = AsyncKernel(template=self, on_output=on_output)
        await kernel.start()
        return kernel

    async def aclose(self) -> None:
        """Close the template's kernel (kernels made from it live on). Idempotent."""
        self._closed = True
        async with self._lock:
            if self._zygote is not None:
                await self._zygote.aclose()
                self._zygote = None
