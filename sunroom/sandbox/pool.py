"""A pool of warm kernels: started ahead of need so a session's kernel is ready at once.

``KernelPool`` keeps ``size`` kernels of one backend, one set of limits and one environment
started and idle (hello checked, nothing installed). ``AsyncKernel(pool=...)`` takes one when it
starts and when it restarts after a timeout or a death, then installs its own host functions and
binds its inputs; the pool refills in the background. A kernel is never handed out twice and
never returned: state from one user never reaches the next.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Mapping
from typing import Self, final

from sunroom.errors import ClosedError, SandboxUnavailableError, UsageError
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.launch import Ready, launch
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.sources import TemplateSource


@final
class KernelPool:
    """Warm kernels for one backend/limits/env. Use ``async with KernelPool(...) as pool``.

    Args:
        backend: as for AsyncKernel (default ``bwrap``).
        limits: the limits every kernel of the pool runs with.
        env: extra environment variables of every kernel.
        size: how many idle kernels to keep ready (>= 1).
        template: keep forks of this :class:`~sunroom.Template` ready instead of cold kernels
            (its backend, limits and env apply; omit them): a kernel taken from the pool has
            the template's setup done, functions installed and inputs bound.

    Closing the pool kills its idle kernels; kernels already handed out belong to their
    AsyncKernel. If the backend cannot start kernels, :meth:`acquire` raises its error
    (SandboxUnavailableError fails closed; there is no fallback).
    """

    def __init__(
        self,
        *,
        backend: str | Backend = backends.DEFAULT_BACKEND,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        size: int = 2,
        template: TemplateSource | None = None,
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise UsageError(f"KernelPool size must be a positive int, got {size!r}")
        self.template = template
        if template is not None:
            if limits is not None and limits != template.limits:
                raise UsageError("a pool of a template's forks runs with its limits; omit limits=")
            if env is not None and dict(env) != template.env:
                raise UsageError("a pool of a template's forks runs with its env; omit env=")
            limits, env, backend = template.limits, template.env, template.backend
        self.limits = limits or Limits()
        self.env = dict(env or {})
        self.size = size
        self._backend_arg = backend
        self._backend: Backend | None = None
        self._ready: deque[Ready] = deque()
        self._wanted = asyncio.Event()
        self._changed = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.cold_starts = 0

    @property
    def backend(self) -> Backend:
        """The resolved backend (after start)."""
        if self._backend is None:
            self._backend = backends.resolve(self._backend_arg)
        return self._backend

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Begin filling the pool in the background (idempotent)."""
        if self._closed:
            raise ClosedError("the pool is closed")
        if self._filler is None:
            self.backend  # noqa: B018 - resolve now: an unknown backend fails here
            self._filler = asyncio.create_task(self._fill(), name="sunroom-pool-filler")
            self._wanted.set()

    async def _fill(self) -> None:
        while not self._closed:
            await self._wanted.wait()
            self._wanted.clear()
            while not self._closed and len(self._ready) < self.size:
                try:
                    ready = await self._start_one()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._error = exc
                    self._changed.set()
                    await asyncio.sleep(1.0)  # retry later; acquire reports the error now
                    continue
                self._error = None
                self._ready.append(ready)
                self._changed.set()

    async def acquire(self) -> Ready:
        """Take a ready kernel (started now if none is idle); the caller owns it.

        Raises ClosedError after close, and the backend's error (SandboxUnavailableError,
        KernelStartError) when kernels cannot be started.
        """
        if self._closed:
            raise ClosedError("the pool is closed")
        await self.start()
        while self._ready:
            ready = self._ready.popleft()
            self._wanted.set()
            if not ready.channel.closed.done() and ready.proc.alive():
                return ready
            await ready.discard()  # died while idle
        if isinstance(self._error, SandboxUnavailableError):
            raise self._error
        self.cold_starts += 1
        self._wanted.set()
        return await self._start_one()

    async def _start_one(self) -> Ready:
        if self.template is not None:
            return await self.template.fork_ready()
        return await launch(self.backend, limits=self.limits, env=self.env)

    def idle(self) -> int:
        """How many kernels are ready right now."""
        return len(self._ready)

    async def wait_ready(self, count: int | None = None, *, timeout_s: float = 60.0) -> None:
        """Wait until *count* (default: size) kernels are idle; raises the fill error, if any."""
        want = self.size if count is None else count
        async with asyncio.timeout(timeout_s):
            while len(self._ready) < want:
                if self._error is not None:
                    raise self._error
                self._changed.clear()
                await self._changed.wait()

    async def aclose(self) -> None:
        """Stop filling and kill every idle kernel. Idempotent."""
        self._closed = True
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._filler
        while self._ready:
            await self._ready.popleft().discard()
