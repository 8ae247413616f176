"""Host functions served to a kernel: the kernel's calls answered, MCP tools bound.

A cell's call of a host function (or of an MCP tool, bound as one module per server) arrives as
a ``call`` request on the kernel's channel; :meth:`KernelServing._serve` answers it from the
kernel's :class:`~sunroom.sandbox.functions.FunctionRegistry`, with the running cell's clock in
context. Lazy or changed MCP servers are bound before a cell, and the wrappers installed again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sunroom.errors import McpServerError, UsageError
from sunroom.rpc import schema
from sunroom.rpc.channel import RpcFailure
from sunroom.rpc.messages import RpcError
from sunroom.sandbox.cellclock import CURRENT_CLOCK
from sunroom.sandbox.codegen import generate
from sunroom.sandbox.functions import FunctionRegistry, rpc_error
from sunroom.sandbox.kernel_lifecycle import KernelLifecycle

if TYPE_CHECKING:
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset


class KernelServing(KernelLifecycle):
    """Answers the kernel's host calls; binds MCP servers' tools as host functions."""

    async def _serve(self, method: str, params: Any) -> Any:
        """Serve a request from the kernel; its params were checked by the channel."""
        if method != "call":
            raise RpcFailure(RpcError("MethodNotFound", f"the host does not serve {method!r}"))
        CURRENT_CLOCK.set(self._clock)  # this request's own context (a copy): no reset needed
        try:
            return await self.registry.invoke(params["name"], params["args"])
        except Exception as exc:  # the kernel gets it as an error answer, by type name
            raise RpcFailure(rpc_error(exc)) from None

    def _rebind(self) -> None:
        """Rebuild the registry and wrappers with the toolset's current MCP functions."""
        assert self._toolset is not None
        old = self.registry
        self.registry = FunctionRegistry([*self._functions, *self._toolset.functions])
        self._wrappers = generate(
            self.registry.functions.values(), module_docs=self._toolset.module_docs()
        )
        old.close()

    async def _bind_lazy(self) -> McpServerError | None:
        """Bind lazy or changed MCP servers before a cell; the failure, if one failed."""
        assert self._toolset is not None
        assert self._channel is not None
        try:
            if not await self._toolset.bind(lazy=True):
                return None
        except McpServerError as exc:
            return exc
        self._rebind()
        await self._channel.call(
            "install",
            {"source": self._wrappers.source, "exports": list(self._wrappers.exports)},
            check=schema.names,
        )
        return None


def toolset_for(mcp: Iterable[McpServer] | Toolset) -> Toolset | None:
    """The toolset for ``mcp=`` (None when no server is given); imports the MCP SDK lazily."""
    try:
        from sunroom.mcp.toolset import Toolset  # the mcp SDK is an optional extra
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"mcp= needs the MCP SDK ({exc.name} is missing): pip install 'sunroom[mcp]'"
        ) from None
    if isinstance(mcp, Toolset):
        return mcp
    servers = list(mcp)
    return Toolset(servers) if servers else None
