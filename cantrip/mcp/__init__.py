"""MCP servers as gate providers: their tools become a circle's gates (the client side).

The SDK itself is imported only when a server is opened. The server side -- ``cantrip
mcp``, a cantrip served as an MCP server -- is :mod:`cantrip.protocols._mcp`; the
``[[circle.mcp]]`` tables of a spec file are read by :mod:`cantrip.spec._providers`
(``servers_from_tables`` is re-exported here on first use).
"""

from cantrip.mcp._provider import MCPServer

__all__ = ["MCPServer", "servers_from_tables"]


def __getattr__(name: str) -> object:
    # The package face's lazy re-export: the spec layer stands above this one.
    if name == "servers_from_tables":
        import importlib

        return importlib.import_module("cantrip.spec._providers").servers_from_tables
    raise AttributeError(f"module 'cantrip.mcp' has no attribute {name!r}")
