"""MCP both ways: MCP servers as gate providers, and ``cantrip mcp`` (a cantrip as an
MCP server). The SDK itself is imported only when a server is opened or served."""

from cantrip.mcp._spec import MCPServer, servers_from_tables

__all__ = ["MCPServer", "servers_from_tables"]
