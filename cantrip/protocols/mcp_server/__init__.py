"""The MCP server side of ``cantrip mcp``: tools, tasks, pauses, results."""
