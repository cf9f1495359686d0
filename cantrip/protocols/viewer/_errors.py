"""The viewer's one error: a request it cannot answer, with the HTTP status and code."""

from __future__ import annotations


class ViewerError(Exception):
    """A request the viewer cannot answer: ``status`` and ``code`` say how."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
