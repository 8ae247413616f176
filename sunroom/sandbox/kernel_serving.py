"""Host functions served to a kernel: the kernel's calls answered, MCP tools bound.

A cell's call of a host function (or of a toolset's tool, an MCP server's, bound as one module
per server; :mod:`sunroom.sandbox.toolset`) arrives as
a ``call`` request on the kernel's channel; :meth:`KernelServing.serve` answers it from the
kernel's :class:`~sunroom.sandbox.functions.FunctionRegistry`, with the running cell's clock and
tracing context in context (a call's spans are children of the cell's). Lazy or changed MCP
servers are bound before a cell, and the wrappers installed again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast, final

from sunroom import tracing
from sunroom.errors import McpServerError
from sunroom.rpc import schema
from sunroom.rpc.channel import RpcFailure
from sunroom.rpc.messages import RpcError
from sunroom.rpc.shapes import CallParams
from sunroom.sandbox.cellclock import CURRENT_CLOCK
from sunroom.sandbox.codegen import WrapperSource, generate
from sunroom.sandbox.functions import FunctionRegistry, HostFunction, rpc_error
from sunroom.sandbox.kernel_lifecycle import KernelCore
from sunroom.sandbox.toolset import Toolset


@final
class KernelServing:
    """A kernel's host functions (and MCP toolset): answers its calls, installs its wrappers.

    *functions* are the kernel's own (a template's first); *own* says whether any of them (or
    a toolset) is the kernel's own rather than its template's, so must be installed in a fork
    of the template.
    """

    def __init__(
        self,
        core: KernelCore,
        functions: tuple[Callable[..., object] | HostFunction, ...],
        *,
        registry: FunctionRegistry,
        wrappers: WrapperSource,
        toolset: Toolset | None,
        own: bool,
    ) -> None:
        self._core = core
        self.functions = functions
        self.registry = registry
        self.wrappers = wrappers
        self.toolset = toolset
        self.own = own

    def copy_for(self, core: KernelCore) -> KernelServing:
        """The same functions served to a forked copy (fresh usage counts, the same toolset)."""
        if self.toolset is not None:
            self.toolset.hold()  # the copies call the same MCP servers
        return KernelServing(
            core,
            self.functions,
            registry=self.registry.copy(),
            wrappers=self.wrappers,
            toolset=self.toolset,
            own=self.own,
        )

    async def serve(self, method: str, params: object) -> object:
        """Serve a request from the kernel; its params were checked by the channel."""
        if method != "call":
            raise RpcFailure(RpcError("MethodNotFound", f"the host does not serve {method!r}"))
        call = cast(CallParams, params)  # schema.call, checked by the channel
        CURRENT_CLOCK.set(self._core.clock)  # this request's own context (a copy): no reset
        try:
            with tracing.within(self._core.trace_context):  # the call's spans: the cell's
                return await self.registry.invoke(call["name"], call["args"])
        except Exception as exc:  # the kernel gets it as an error answer, by type name
            raise RpcFailure(rpc_error(exc)) from None

    def prepare(self) -> asyncio.Future[bool] | None:
        """Begin binding the toolset's eager servers (while the kernel boots); None: none."""
        if self.toolset is None:
            return None
        return asyncio.ensure_future(self.toolset.bind())

    async def install(self, binding: asyncio.Future[bool] | None, *, forked: bool) -> None:
        """Install the wrappers in a fresh process (after *binding*, the toolset's, if any).

        A fork of a template (*forked*) has the template's functions already: only the
        kernel's own are installed then.
        """
        if binding is not None and await binding:
            self.rebind()
        if not forked and self.registry.functions or self.own:
            await self.send()

    async def send(self) -> None:
        """Send the wrappers' source to the kernel, to be imported there."""
        channel = self._core.channel
        assert channel is not None
        await channel.call(
            "install",
            {"source": self.wrappers.source, "exports": list(self.wrappers.exports)},
            check=schema.names,
        )

    def rebind(self) -> None:
        """Rebuild the registry and wrappers with the toolset's current MCP functions."""
        assert self.toolset is not None
        old = self.registry
        self.registry = FunctionRegistry([*self.functions, *self.toolset.functions])
        self.wrappers = generate(
            self.registry.functions.values(), module_docs=self.toolset.module_docs()
        )
        old.close()

    async def bind_lazy(self) -> McpServerError | None:
        """Bind lazy or changed MCP servers before a cell; the failure, if one failed."""
        assert self.toolset is not None
        try:
            if not await self.toolset.bind(lazy=True):
                return None
        except McpServerError as exc:
            return exc
        self.rebind()
        await self.send()
        return None

    def release(self) -> Toolset | None:
        """Close the registry and hand the toolset back (for the caller to release)."""
        self.registry.close()
        toolset, self.toolset = self.toolset, None
        return toolset
