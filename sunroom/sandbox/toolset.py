"""The toolset seam: host-side tools bound into a kernel as modules, and who makes them.

A kernel given ``mcp=[...]`` serves the tools of those servers to its cells, one module per
server (``github.search_issues(...)``), like host functions. What it needs from them is a
:class:`Toolset`: connect and list the tools (now or before a cell), hand them over as host
functions with a docstring per module, and stop with the last kernel that holds them.

The seam exists so the sandbox never imports the MCP client package (which sits above it in
the layering, and needs the optional MCP SDK): that package implements the protocol and
installs, when it is imported, the factory that turns ``mcp=`` servers into a toolset
(:func:`install`). Making a server (``stdio(...)``, ``http(...)``) imports that package, so a
kernel given servers always has the factory; anything that satisfies :class:`Toolset` is taken
as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sunroom.errors import UsageError

if TYPE_CHECKING:
    from sunroom.sandbox.functions import HostFunction

__all__ = ["Server", "Toolset", "install", "toolset_for"]


class Server(Protocol):
    """A server of tools as ``mcp=`` takes it (made by the MCP package's ``stdio``, ``http``)."""

    @property
    def name(self) -> str:
        """The module its tools are bound as."""
        ...


@runtime_checkable
class Toolset(Protocol):
    """Host-side tools a kernel binds as one module per server and serves to its cells."""

    @property
    def pending(self) -> bool:
        """Whether a server still has to be bound (lazy, or its tool list changed)."""
        ...

    async def bind(self, *, lazy: bool = False) -> bool:
        """Connect and list what needs it (all when *lazy*: before a cell); whether it changed.

        At kernel start (``lazy=False``) a failure raises McpServerError and fails the start;
        before a cell it raises McpServerError too, and that cell gets the error.
        """
        ...

    @property
    def functions(self) -> tuple[HostFunction, ...]:
        """Every bound tool, as a host function named ``<module>.<tool>``."""
        ...

    def module_docs(self) -> Mapping[str, str]:
        """The docstring of each module in the kernel."""
        ...

    def hold(self) -> None:
        """One more kernel (a forked copy) uses the toolset."""
        ...

    async def aclose(self) -> None:
        """Release one holder; the last one stops the servers."""
        ...


Factory = Callable[[list[Server]], Toolset]
"""Makes the toolset of ``mcp=`` servers (raises UsageError for servers it does not take)."""

_factory: list[Factory] = []


def install(factory: Factory) -> None:
    """Make *factory* the one that turns ``mcp=`` servers into a toolset (the MCP package's)."""
    _factory[:] = [factory]


def toolset_for(mcp: Iterable[Server] | Toolset) -> Toolset | None:
    """The toolset for ``mcp=``: itself when it is one, None for no server, else the factory's."""
    if isinstance(mcp, Toolset):
        return mcp
    servers = list(mcp)
    if not servers:
        return None
    if not _factory:  # no MCP server was made (making one installs the factory)
        raise UsageError("mcp= takes servers made by sunroom.mcp.stdio() or sunroom.mcp.http()")
    return _factory[0](servers)
