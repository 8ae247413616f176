"""sunroom as an MCP server (``sunroom mcp``): a session's kernel and agent offered as MCP tools."""
