"""MCP servers as gate providers: their tools become a circle's gates (the client side).

The SDK itself is imported only when a server is opened. The server side -- ``cantrip
mcp``, a cantrip served as an MCP server -- is :mod:`cantrip.protocols.mcp_server._server`; the
``[[circle.mcp]]`` tables of a spec file are read by :mod:`cantrip.spec`
(``servers_from_tables``).
"""

from cantrip.mcp._provider import MCPServer

__all__ = ["MCPServer"]
