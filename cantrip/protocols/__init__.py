"""Protocol adapters: the same cantrip behind ACP (and, later, HTTP) (PROD-1)."""

from cantrip.protocols._acp import AcpServer, prompt_text, serve_stdio

__all__ = ["AcpServer", "prompt_text", "serve_stdio"]
