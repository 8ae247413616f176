"""MCP servers bound into kernels as typed modules (the MCP client side).

Binding (``docs/mcp.md``): describe servers with :func:`stdio` / :func:`http` (or
:func:`from_config` for a ``{"mcpServers": ...}`` file) and pass them as ``mcp=[...]`` to
``AsyncKernel``, ``Kernel`` or ``AsyncSession``. Each server's tools appear in the kernel as a
module, ``github.search_issues(query="...")``, with real signatures from the tools' schemas; calls
run on the host, so the server's credentials never enter the kernel. Needs ``sunroom[mcp]``
(the official ``mcp`` SDK). sunroom as an MCP server lives in :mod:`sunroom.service.mcp`.
"""

from sunroom.mcp.servers import HttpServer, McpServer, StdioServer, from_config, http, stdio

__all__ = ["HttpServer", "McpServer", "StdioServer", "from_config", "http", "stdio"]
