"""MCP servers bound into kernels as typed modules (the MCP client side).

Binding (``docs/mcp.md``): describe servers with :func:`stdio` / :func:`http` (or
:func:`from_config` for a ``{"mcpServers": ...}`` file) and pass them as ``mcp=[...]`` to
``AsyncKernel``, ``Kernel`` or ``AsyncSession``. Each server's tools appear in the kernel as a
module, ``github.search_issues(query="...")``, with real signatures from the tools' schemas; calls
run on the host, so the server's credentials never enter the kernel. Needs ``sunroom[mcp]``
(the official ``mcp`` SDK). sunroom as an MCP server lives in :mod:`sunroom.service.mcp`.
"""

from collections.abc import Sequence
from typing import cast

from sunroom.errors import UsageError
from sunroom.mcp.servers import HttpServer, McpServer, StdioServer, from_config, http, stdio
from sunroom.sandbox import toolset as _seam

__all__ = ["HttpServer", "McpServer", "StdioServer", "from_config", "http", "stdio"]


def _toolset(servers: Sequence[_seam.Server]) -> _seam.Toolset:
    """The toolset of ``mcp=`` servers (installed below as the kernel's factory)."""
    try:
        from sunroom.mcp.toolset import Toolset  # the mcp SDK is an optional extra
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"mcp= needs the MCP SDK ({exc.name} is missing): pip install 'sunroom[mcp]'"
        ) from None
    return Toolset(cast(Sequence[McpServer], servers))  # it refuses anything else


_seam.install(_toolset)  # the sandbox turns mcp= servers into a toolset through this
