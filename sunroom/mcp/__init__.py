"""MCP: servers bound into kernels, and sunroom as an MCP server."""
