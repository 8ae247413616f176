"""``Kernel``: the thin synchronous twin of :class:`~sunroom.sandbox.kernel.AsyncKernel`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self, final

from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend, KernelProcess
from sunroom.sandbox.files import Files
from sunroom.sandbox.functions import FunctionRegistry, HostFunction
from sunroom.sandbox.kernel import AsyncKernel, OutputCallback
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.network import KernelNetwork
from sunroom.sandbox.packages import InstalledPackage, PackageListing, Packages
from sunroom.sandbox.portal import Portal, TwinState
from sunroom.sandbox.result import ExecutionResult, Variable
from sunroom.sandbox.toolset import Server, Toolset

if TYPE_CHECKING:
    from sunroom.network.policy import Network
    from sunroom.network.proxy import Connection
    from sunroom.tracing import Link


@final
class Kernel:
    """A persistent, supervised Python kernel with a blocking API.

    Same arguments as :class:`AsyncKernel`. Use ``with Kernel(...) as k``; leaving the block
    (or :meth:`close`) kills and awaits the whole process tree. Async host functions run on
    the kernel's private event loop; sync ones on a worker thread. :attr:`state` says where
    the kernel is in its life; after :meth:`close` every call raises ClosedError and closing
    again does nothing.
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
        mcp: Iterable[Server] | Toolset = (),
        network: Network | None = None,
        on_connection: Callable[[Connection], None] | None = None,
        packages: Packages | None = None,
    ) -> None:
        self._portal = Portal("sunroom-kernel-loop", what="the kernel")
        self._users = [1]  # kernels sharing the portal: this one and its copies
        self._state = TwinState.UNOPENED
        try:
            self._core: AsyncKernel = self._portal.call(
                _build(
                    backend,
                    functions,
                    inputs,
                    limits,
                    env,
                    on_output,
                    mcp,
                    network,
                    on_connection,
                    packages,
                )
            )
        except BaseException:
            self._portal.close()
            raise
        self._files = Files(self._portal, self._core.files)

    @classmethod
    def _copy_of(cls, parent: Kernel, core: AsyncKernel) -> Kernel:
        copy = cls.__new__(cls)
        copy._portal, copy._users = parent._portal, parent._users
        copy._users[0] += 1
        copy._state = TwinState.OPENED
        copy._core = core
        copy._files = Files(copy._portal, core.files)
        return copy

    @property
    def core(self) -> AsyncKernel:
        """The async kernel underneath."""
        return self._core

    @property
    def process(self) -> KernelProcess | None:
        """The running process handle (for tests and diagnostics)."""
        return self._core.process

    @property
    def network(self) -> KernelNetwork | None:
        """The kernel's network policy and what crossed it; see ``AsyncKernel.network``."""
        return self._core.network

    @property
    def running(self) -> bool:
        """Whether the kernel is started and alive; see ``AsyncKernel.running``."""
        return self._core.running

    @property
    def limits(self) -> Limits:
        """The kernel's limits."""
        return self._core.limits

    @property
    def restarts(self) -> int:
        """How many times the kernel was started afresh; see ``AsyncKernel.restarts``."""
        return self._core.restarts

    @property
    def trace_links(self) -> tuple[Link, ...]:
        """Span links of the kernel's cells; see ``AsyncKernel.trace_links``."""
        return self._core.trace_links

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The running kernel's hello; see ``AsyncKernel.kernel_info``."""
        return self._core.kernel_info

    @property
    def registry(self) -> FunctionRegistry:
        """The host functions the kernel serves; see ``AsyncKernel.registry``."""
        return self._core.registry

    @property
    def on_output(self) -> OutputCallback | None:
        """Where cells' output goes as they write it; see ``AsyncKernel.on_output``."""
        return self._core.on_output

    @property
    def files(self) -> Files:
        """The workdir's files, blocking; see ``AsyncKernel.files``."""
        return self._files

    @property
    def state(self) -> TwinState:
        """UNOPENED until started, OPENED while usable, CLOSED for good after close()."""
        return self._state

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the kernel (idempotent); raises ClosedError after close()."""
        self._portal.call(self._core.start())
        self._state = TwinState.OPENED

    def execute(
        self, code: str, *, timeout_s: float | None = None, filename: str | None = None
    ) -> ExecutionResult:
        """Run one cell; see ``AsyncKernel.execute``."""
        # eager: the request is sent as soon as the loop thread takes the call
        return self._portal.call(
            self._core.execute(code, timeout_s=timeout_s, filename=filename), eager=True
        )

    def bind(self, **values: Any) -> None:
        """Set variables; see ``AsyncKernel.bind``."""
        self._portal.call(self._core.bind(**values))

    def variables(self) -> list[Variable]:
        """The user's variables; see ``AsyncKernel.variables``."""
        return self._portal.call(self._core.variables())

    def install(self, *requirements: str, timeout_s: float | None = None) -> list[InstalledPackage]:
        """Install packages into the kernel; see ``AsyncKernel.install``."""
        return self._portal.call(self._core.install(*requirements, timeout_s=timeout_s))

    def list_packages(self) -> PackageListing:
        """What the kernel can import; see ``AsyncKernel.list_packages``."""
        return self._portal.call(self._core.list_packages())

    @property
    def packages(self) -> Packages:
        """The kernel's package settings (see :class:`~sunroom.Packages`)."""
        return self._core.packages

    def interrupt(self) -> None:
        """Interrupt the running cell (safe to call from any thread)."""
        self._portal.call_soon(self._core.interrupt)

    def restart(self) -> None:
        """Restart with the same inputs and host functions."""
        self._portal.call(self._core.restart())

    def fork(self, n: int = 1, *, on_output: OutputCallback | None = None) -> list[Kernel]:
        """Copies of this idle kernel's live state; see :meth:`AsyncKernel.fork`.

        The copies share this kernel's event-loop thread, which stops with the last of them.
        """
        cores = self._portal.call(self._core.fork(n, on_output=on_output))
        return [Kernel._copy_of(self, core) for core in cores]

    def close(self) -> None:
        """Kill the whole process tree, wait for it and stop the loop thread. Idempotent."""
        if self._state is TwinState.CLOSED:
            return
        self._state = TwinState.CLOSED
        try:
            self._portal.call(self._core.aclose())
        finally:
            self._users[0] -= 1
            if self._users[0] == 0:
                self._portal.close()


async def _build(
    backend: str | Backend,
    functions: Iterable[Callable[..., Any] | HostFunction],
    inputs: Mapping[str, Any] | None,
    limits: Limits | None,
    env: Mapping[str, str] | None,
    on_output: OutputCallback | None,
    mcp: Iterable[Server] | Toolset,
    network: Network | None,
    on_connection: Callable[[Connection], None] | None,
    packages: Packages | None,
) -> AsyncKernel:
    return AsyncKernel(
        backend=backend,
        functions=functions,
        inputs=inputs,
        limits=limits,
        env=env,
        on_output=on_output,
        mcp=mcp,
        network=network,
        on_connection=on_connection,
        packages=packages,
    )
