"""The one status table of the HTTP API: what each refusal of a session backend is.

A :class:`~cantrip.protocols.sessions.SessionBackend` raises only
:class:`~cantrip.protocols.sessions._hub.SessionError` (a ``kind``) and
:class:`~cantrip.PauseError` (drift 12: the ``--db`` server used to turn database
failures into HTTP answers inside its own copy of the routes); the lifecycle layer
raises the same for ``overloaded`` and ``shutting_down`` (drift 11). Here, once, each
becomes the API's status: the same for every mode, so a status cannot change in one
server and not the other.
"""

from __future__ import annotations

from cantrip._approval import PauseError
from cantrip.protocols.asgi._responses import HttpError
from cantrip.protocols.sessions import SessionError
from cantrip.protocols.sessions._steering import FULL as STEERING_FULL

SESSION_ERRORS = {
    "not_found": 404,
    "bad_request": 400,
    "busy": 409,
    "not_running": 409,
    "key_reused": 422,
    "user_conflict": 409,
    STEERING_FULL: 429,
    "cannot_delete": 409,
    "unsupported": 501,
    "cast_failed": 500,
    "cast_dead_lettered": 500,
    "crashed": 500,
    "database_error": 500,
    "overloaded": 503,
    "shutting_down": 503,
    "too_many_sessions": 503,
    "database_unavailable": 503,
}
"""HTTP status of each SessionError kind (422 for a reused key: the Idempotency-Key
draft, section 2.7; 429 for a cast that has taken all the steering it takes,
:mod:`cantrip.protocols.sessions._steering`; 503 for "not now", with ``Retry-After``)."""

CODES = {"not_found": "unknown_session"}
"""The API's error code where it is not the kind's own name."""


def unavailable(code: str, message: str, retry_after_s: int) -> HttpError:
    """A 503 that tells the client when to come back (RFC 9110 15.6.4, 10.2.3); a
    server shutting down closes the connection too."""
    headers = {"retry-after": str(retry_after_s)}
    if code == "shutting_down":
        headers["connection"] = "close"
    return HttpError(503, code, message, headers)


def http_error(exc: SessionError | PauseError, retry_after_s: int) -> HttpError:
    """The API's answer to a refusal: its status from :data:`SESSION_ERRORS` (409 for a
    kind it does not name), ``Retry-After`` with a 429 or a 503."""
    if isinstance(exc, PauseError):
        return HttpError(409, "pause_answered", str(exc))
    status = SESSION_ERRORS.get(exc.kind, 409)
    if status == 503:
        return unavailable(exc.kind, exc.message, retry_after_s)
    headers = {"retry-after": str(retry_after_s)} if status == 429 else None
    return HttpError(status, CODES.get(exc.kind, exc.kind), exc.message, headers)
