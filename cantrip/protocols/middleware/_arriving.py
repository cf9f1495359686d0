"""A prompt request known to its session from the moment it arrives.

A cancel may overtake its prompt: sent while the prompt's body is still arriving (a
slow client, a large body read by the guard), it is to cut that prompt off as it
starts (``starting``), as a cancel naming a key not seen yet is armed for it. The
backend that can tell (the in-process one: ``ProcessBackend.announce``) is handed
every ``POST /sessions/{id}/prompt`` from its arrival to its answer; the request's own
``submit`` (in the same task) is then that announced prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from cantrip.protocols.asgi._requests import idempotency_key
from cantrip.protocols.asgi._responses import HttpError, Receive, Scope, Send

App = Callable[[Scope, Receive, Send], Any]
Announce = Callable[[str, str | None], AbstractContextManager[None]]
"""``announce(session_id, idempotency_key)``: entered for as long as the request runs."""


def arrivals(app: App, announce: Announce) -> App:
    """``app`` with each prompt request announced (see the module docstring); put it
    outside the guard, so the announcement covers the body the guard reads."""

    async def arriving(scope: Scope, receive: Receive, send: Send) -> None:
        parts = [p for p in scope.get("path", "").split("/") if p]
        if not (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and len(parts) == 3
            and parts[0] == "sessions"
            and parts[2] == "prompt"
        ):
            await app(scope, receive, send)
            return
        try:
            key = idempotency_key(scope)
        except HttpError:  # a bad key is the route's to refuse
            key = None
        with announce(parts[1], key):
            await app(scope, receive, send)

    return arriving
