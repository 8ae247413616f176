"""Forking a live kernel: :meth:`fork` into copies, each adopted as a kernel of its own.

The mechanics (the runtime's ``fork()``, the copies' sockets, supervisors and cgroups) are in
:mod:`sunroom.sandbox.forking`; this part checks the kernel is idle, asks for the copies and
gives each the parent's functions, inputs, limits and network. See docs/fork.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sunroom.errors import ClosedError, ForkError, UsageError
from sunroom.rpc.channel import RemoteError, cut
from sunroom.sandbox import forking
from sunroom.sandbox.kernel_lifecycle import KernelLifecycle, OutputCallback
from sunroom.sandbox.launch import Ready

if TYPE_CHECKING:
    from sunroom.sandbox.kernel import AsyncKernel


class KernelFork(KernelLifecycle):
    """Copies of an idle kernel's live state, each a kernel of its own."""

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

    async def _fork_ready(
        self, n: int, *, tenants: list[int | None] | None = None, share: int = 1
    ) -> list[Ready]:
        """Fork into *n* copies and return them ready, not yet adopted (see :meth:`fork`).

        *tenants*: make each copy a tenant of its own (a zygote's; see ``forking.fork``).
        """
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
                    tenants=tenants,
                    share=share,
                )
            except RemoteError as exc:
                why = cut(exc.error.message, 400)
                raise ForkError(f"the kernel refused to fork: {why}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await self._died("fork", exc) from None

    def _adopt_copy(self, ready: Ready, on_output: OutputCallback | None) -> AsyncKernel:
        from sunroom.sandbox.kernel import AsyncKernel  # the class this part belongs to

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
