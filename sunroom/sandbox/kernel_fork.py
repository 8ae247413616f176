"""Forking a live kernel: :meth:`fork` into copies, each adopted as a kernel of its own.

The mechanics (the runtime's ``fork()``, the copies' sockets, supervisors and cgroups) are in
:mod:`sunroom.sandbox.forking`; this part checks the kernel is idle and asks for the copies;
:class:`~sunroom.sandbox.kernel.AsyncKernel` adopts each as a kernel with the parent's functions,
inputs, limits and network. See docs/fork.md.
"""

from __future__ import annotations

from typing import final

from sunroom.errors import ClosedError, ForkError, UsageError
from sunroom.rpc.channel import RemoteError, cut
from sunroom.sandbox import forking
from sunroom.sandbox.kernel_lifecycle import KernelCore
from sunroom.sandbox.launch import Ready


@final
class KernelFork:
    """Copies of an idle kernel's live state, ready to be adopted as kernels of their own."""

    def __init__(self, core: KernelCore) -> None:
        self._core = core

    async def fork_ready(
        self, n: int, *, tenants: list[int | None] | None = None, share: int = 1
    ) -> list[Ready]:
        """Fork into *n* copies and return them ready, not yet adopted (see ``AsyncKernel.fork``).

        *tenants*: make each copy a tenant of its own (a zygote's; see ``forking.fork``).
        """
        core = self._core
        if not isinstance(n, int) or isinstance(n, bool):
            raise UsageError("n must be an int")
        if core.lock.locked():
            raise ForkError(
                "cannot fork while the kernel is busy (a cell, a bind or a file transfer runs)"
            )
        async with core.lock:
            await core.ensure()
            assert core.backend is not None
            assert core.proc is not None
            channel, router = core.channel, core.router
            assert channel is not None
            assert router is not None
            family, member = forking.family_of(core.proc, core.backend.name)
            core.proc = member
            try:
                return await forking.fork(
                    channel,
                    member,
                    family,
                    backend=core.backend.name,
                    n=n,
                    limits=core.limits,
                    hello=core.info,
                    router=router,
                    tenants=tenants,
                    share=share,
                )
            except RemoteError as exc:
                why = cut(exc.error.message, 400)
                raise ForkError(f"the kernel refused to fork: {why}") from None
            except (ClosedError, ConnectionError) as exc:
                raise await core.died("fork", exc) from None
