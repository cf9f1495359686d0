"""Protocol adapters: the same cantrip behind ACP, HTTP and the terminal (PROD-1).

All of them reach entities through one :class:`SessionHub` (ACP, HTTP) or an
:class:`~cantrip._server.EntityServer` (``cantrip invoke``), and every cast
is ``Entity.send``.

The server sides of MCP (``cantrip mcp``: :mod:`._mcp`, with its tasks, pauses and
results) and A2A (:mod:`._a2a`) live here too; their client sides are
:mod:`cantrip.mcp` and :mod:`cantrip.a2a`.
"""

from cantrip.protocols.acp._rpc import prompt_text
from cantrip.protocols.acp._server import AcpServer
from cantrip.protocols.acp._stdio import serve_stdio
from cantrip.protocols.http._app import HttpApp
from cantrip.protocols.http._serve import serve_http
from cantrip.protocols.sessions._hub import Session, SessionError, SessionHub

__all__ = [
    "AcpServer",
    "HttpApp",
    "Session",
    "SessionError",
    "SessionHub",
    "prompt_text",
    "serve_http",
    "serve_stdio",
]
