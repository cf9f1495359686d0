"""What an AG-UI request says of reconnecting: the ``Last-Event-ID`` a client already
has, and ``?reconnect_s=``, how long its prompt outlives a hang-up.

Apart from :mod:`._run` because it reads the HTTP request (its headers and query), a
400 before anything runs, and holds none of the run's lifecycle; it imports no
``ag_ui``."""

from __future__ import annotations

from urllib.parse import parse_qs

from cantrip.protocols.asgi._requests import last_event_id
from cantrip.protocols.asgi._responses import HttpError, Scope

MAX_RECONNECT_S = 300.0
"""The longest ``?reconnect_s=`` a run may ask for."""


def reconnection(scope: Scope | None) -> tuple[int | None, float]:
    """What a request says of reconnecting: the id of the last event a client has
    (``Last-Event-ID``: a run's ids are whole numbers, its events' places), and how
    long a prompt outlives a hang-up waiting for its client to come back
    (``?reconnect_s=``, 0 to :data:`MAX_RECONNECT_S`; default 0: a hang-up cancels at
    once). Anything else is a 400 before anything runs."""
    if scope is None:
        return None, 0.0
    after: int | None = None
    raw = last_event_id(scope)
    if raw is not None:
        if not (raw.isdigit() and raw.isascii() and len(raw) <= 12):
            raise HttpError(400, "bad_event_id", "an AG-UI run's event ids are whole numbers")
        after = int(raw)
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    reconnect_s = 0.0
    if query.get("reconnect_s"):
        try:
            reconnect_s = float(query["reconnect_s"][-1])
        except ValueError:
            reconnect_s = -1.0
        if not 0 <= reconnect_s <= MAX_RECONNECT_S:  # (NaN fails both)
            raise HttpError(
                400,
                "bad_request",
                f"reconnect_s is a number of seconds from 0 to {MAX_RECONNECT_S:g}",
            )
    return after, reconnect_s
