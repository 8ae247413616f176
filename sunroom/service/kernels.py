"""Raw kernels for other frameworks: :class:`KernelManager`.

A raw kernel is an :class:`~sunroom.sandbox.kernel.AsyncKernel` the client drives itself, one
cell at a time; it is not persisted (a server restart loses it). Cells of one kernel run one
after another, in arrival order.

Admission: at most ``config.max_kernel_requests`` kernel requests (starts and executes) are in
flight or queued at once, over all kernels; :meth:`KernelManager.admitted` refuses one more
with :class:`~sunroom.service.problems.CapacityError` (429, ``Retry-After: 1``) before any of
its work (reading the body included) is done, so the queue in front of the kernels stays bounded.

Shutdown: :meth:`KernelManager.shut_down` (the server got SIGTERM/SIGINT) closes every kernel,
those still starting included, at once; the requests in flight on them (a start, a cell, a
fork) and any that come later answer 503 :class:`~sunroom.service.problems.ShuttingDown`
rather than being cancelled by the server's graceful-shutdown timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from typing import final

from sunroom.errors import SunroomError, UsageError
from sunroom.sandbox.backends.choice import describe_backend
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.result import ExecutionResult
from sunroom.sandbox.template import Template
from sunroom.service.config import ServiceConfig
from sunroom.service.problems import CapacityError, NotFoundError, ShuttingDown
from sunroom.service.schemas import CreateKernel, network_spec
from sunroom.service.templates import Templates

__all__ = ["KernelManager"]

log = logging.getLogger("sunroom.service")


@final
class KernelManager:
    """Starts, runs and closes raw kernels, at most ``config.max_kernels`` at once.

    *functions* are the host functions every kernel gets. :meth:`aclose` kills them all.
    """

    def __init__(
        self,
        *,
        config: ServiceConfig,
        functions: Sequence[HostFunction] = (),
        templates: Templates | None = None,
    ) -> None:
        self.config = config
        self._templates = templates or Templates(config)
        self._functions = tuple(functions)
        self._kernels: dict[str, AsyncKernel] = {}
        self._about: dict[str, dict[str, object]] = {}
        self._starting = 0
        self._in_flight = 0
        self._opening: set[AsyncKernel] = set()  # being started: shut_down closes them too
        self._shutting_down = False
        self._stopping = asyncio.Event()  # set by shut_down: waits on a template give up

    @property
    def live(self) -> int:
        """Kernels running (or starting) now."""
        return len(self._kernels) + self._starting

    @property
    def in_flight(self) -> int:
        """Kernel requests admitted by :meth:`admitted` and not finished yet."""
        return self._in_flight

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Count one kernel request (a start or an execute) as in flight while the block runs.

        Raises CapacityError (429, ``Retry-After: 1``) at once, before the block runs, when
        ``config.max_kernel_requests`` are in flight or queued already; ShuttingDown (503)
        once :meth:`shut_down` was called.
        """
        self._refuse_when_shutting_down()
        bound = self.config.max_kernel_requests
        if self._in_flight >= bound:
            raise CapacityError(
                f"this server has its limit of {bound} kernel requests in flight; retry later"
            )
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    async def create(self, request: CreateKernel) -> str:
        """Start a kernel and return its id.

        Raises CapacityError, UsageError, KernelStartError, SandboxUnavailableError,
        ShuttingDown (:meth:`shut_down` was called before or while it started).
        """
        if self.live >= self.config.max_kernels:
            raise CapacityError(f"this server runs its limit of {self.config.max_kernels} kernels")
        self._starting += 1
        try:
            if request.template is not None:
                chose = (request.limits, request.backend, request.kernel_name, request.sandbox)
                if any(x is not None for x in chose):
                    raise UsageError(
                        "a kernel from a template runs on its backend with its limits; "
                        "omit backend and limits (kernel_name and sandbox too)"
                    )
                template = await self._unless_stopped(self._templates.get(request.template))
                backend = template.backend
                kernel = AsyncKernel(
                    template=template,
                    functions=self._functions,
                    inputs=request.inputs or None,
                    mcp=self.config.mcp(request.mcp),
                    network=self.config.network(network_spec(request.network)),
                )
            else:
                backend = self.config.kernel_backend(
                    request.backend, kernel_name=request.kernel_name, sandbox=request.sandbox
                )
                kernel = AsyncKernel(
                    backend=backend,
                    functions=self._functions,
                    inputs=request.inputs or None,
                    limits=request.limits.build() if request.limits else None,
                    mcp=self.config.mcp(request.mcp),
                    network=self.config.network(network_spec(request.network)),
                )
            self._opening.add(kernel)
            try:
                await kernel.start()
            except BaseException as exc:
                await kernel.aclose()  # its MCP servers stop too
                if self._shutting_down and isinstance(exc, SunroomError):
                    raise self._stopped() from None  # shut_down closed it while it started
                raise
            finally:
                self._opening.discard(kernel)
            if self._shutting_down:  # started while shut_down ran: it is not kept
                await kernel.aclose()
                raise self._stopped()
        finally:
            self._starting -= 1
        kid = uuid.uuid4().hex
        self._kernels[kid] = kernel
        self._about[kid] = {
            **describe_backend(backend),
            "template": request.template,
            "network": request.network if isinstance(request.network, str) else None,
            "created_at": time.time(),
        }
        return kid

    async def fork(self, kid: str, n: int) -> list[str]:
        """Fork kernel *kid* into *n* copies (raw kernels of their own); return their ids.

        The copies count against ``config.max_kernels``. Raises NotFoundError, CapacityError,
        ForkError (busy, or threads of its own), UsageError (a backend that cannot fork),
        ShuttingDown.
        """
        kernel = self._get(kid)
        if self.live + n > self.config.max_kernels:
            raise CapacityError(
                f"this server runs its limit of {self.config.max_kernels} kernels; "
                f"{n} more would pass it"
            )
        self._starting += n
        try:
            copies = await kernel.fork(n)
        except SunroomError:
            if self._shutting_down:  # the kernel was closed under the fork
                raise self._stopped() from None
            raise
        finally:
            self._starting -= n
        if self._shutting_down:
            await asyncio.gather(*(c.aclose() for c in copies), return_exceptions=True)
            raise self._stopped()
        ids = []
        for copy in copies:
            ids.append(uuid.uuid4().hex)
            self._kernels[ids[-1]] = copy
            self._about[ids[-1]] = {**self._about[kid], "created_at": time.time()}
        return ids

    def describe(self, kid: str) -> dict[str, object]:
        """What ``GET /kernels/{id}`` reports about kernel *kid*.

        ``kernel_id``, ``backend``, ``kernel_name`` and ``sandbox`` (None but for
        ``jupyter``), ``template``, ``network`` (the configured policy's name, or None) and
        ``network_bytes`` (through its proxy so far; None without a network), and
        ``created_at`` (Unix time).

        Raises NotFoundError.
        """
        kernel = self._get(kid)
        used = kernel.network.bytes_total if kernel.network is not None else None
        return {"kernel_id": kid, **self._about[kid], "network_bytes": used}

    def listing(self) -> list[dict[str, object]]:
        """What ``GET /kernels`` reports: :meth:`describe` of every live kernel, oldest first.

        The kernels of this manager only, which are those of this server's token: a kernel
        still starting is not listed yet.
        """
        return [self.describe(kid) for kid in self._kernels]  # in the order they were added

    def holds(self, kid: str) -> bool:
        """Whether raw kernel *kid* runs here."""
        return kid in self._kernels

    def kernel(self, kid: str) -> AsyncKernel:
        """The raw kernel *kid* (for its files). Raises NotFoundError."""
        return self._get(kid)

    def _get(self, kid: str) -> AsyncKernel:
        kernel = self._kernels.get(kid)
        if kernel is None:
            raise NotFoundError(f"no kernel {kid!r}")
        return kernel

    async def execute(self, kid: str, code: str, *, timeout_s: float | None) -> ExecutionResult:
        """Run one cell.

        Raises NotFoundError, ClosedError (deleted meanwhile), ShuttingDown (the server stopped:
        the kernel was closed under the cell, whose result is lost).
        """
        kernel = self._get(kid)
        self._refuse_when_shutting_down()
        try:
            out = await kernel.execute(code, timeout_s=timeout_s)
        except SunroomError:
            if self._shutting_down:
                raise self._stopped() from None
            raise
        if self._shutting_down:  # a cell the closing kernel cut off ("died"): not its answer
            raise self._stopped()
        return out

    async def delete(self, kid: str) -> None:
        """Kill the kernel. Raises NotFoundError."""
        kernel = self._get(kid)
        del self._kernels[kid]
        self._about.pop(kid, None)
        await kernel.aclose()

    async def shut_down(self) -> None:
        """The server is stopping: close every kernel (those starting too) and refuse the rest.

        Requests in flight on them, and every kernel request after this, raise ShuttingDown
        (503). A kernel that fails to close is logged, as in :meth:`aclose`.
        """
        self._shutting_down = True
        self._stopping.set()
        await self.aclose()

    async def _unless_stopped(self, starting: Coroutine[object, object, Template]) -> Template:
        """Await *starting* (a template's first start), or raise ShuttingDown on shut_down.

        The start is cancelled then (its kernel closed before the answer), not left for the
        server's graceful-shutdown timeout to cut with a traceback; a caller cancelled itself
        cancels it too.
        """
        task = asyncio.ensure_future(starting)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if task.cancelled() or (self._shutting_down and task.exception() is not None):
            raise self._stopped()
        return task.result()

    def _refuse_when_shutting_down(self) -> None:
        if self._shutting_down:
            raise self._stopped()

    @staticmethod
    def _stopped() -> ShuttingDown:
        return ShuttingDown("the server is shutting down and has closed its kernels")

    async def aclose(self) -> None:
        """Kill every kernel; a kernel that fails to close is logged, the others still close."""
        kernels, self._kernels = [*self._kernels.values(), *self._opening], {}
        self._about.clear()
        outcomes = await asyncio.gather(*(k.aclose() for k in kernels), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                log.error("closing a raw kernel failed", exc_info=outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
