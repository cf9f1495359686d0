"""Ids a client sends, parsed one way for every front end (SPEC.md "Ids from clients").

A client names things with ids of its own or of ours: AG-UI's ``threadId``, ``runId``
and interrupt ids, an ``Idempotency-Key``, the prompt id or key a cancel names, ACP's
``sessionId``. Each ends up hashed (``.encode()``), stored (PostgreSQL text cannot
hold U+0000 nor an unpaired surrogate) or echoed in every event of a stream, so an id
that JSON can spell but UTF-8 cannot -- ``"\\ud800"`` -- once got as far as a hash and
crashed the request after it had begun. :func:`client_id` is the one check: a
non-empty string within a length bound, no NUL, valid Unicode. Every front end calls
it while it parses the request, and turns :class:`BadIdError` into its protocol's
refusal (HTTP 400, JSON-RPC invalid params), before anything is created or queued.

(A2A's ids are parsed by the a2a-sdk's protobuf reader, which refuses an unpaired
surrogate itself with JSON-RPC's invalid params; ``tests/test_a2a_server.py`` keeps
that so.)
"""

from __future__ import annotations

from cantrip._text import TextError, check_text

MAX_ID = 256
"""The longest id taken where no protocol says otherwise (AG-UI's thread and run ids
name sessions and appear in every event)."""


class BadIdError(ValueError):
    """An id a client sent that no front end takes (the message says why, in one line)."""


def client_id(raw: str, what: str, max_length: int = MAX_ID) -> str:
    """``raw`` if it is a usable id: 1 to ``max_length`` characters, no NUL, and valid
    Unicode (no unpaired surrogate, which no UTF-8 hash, database or client can carry).
    ``what`` names the id in the error."""
    if not raw or len(raw) > max_length:
        raise BadIdError(f"{what} must be 1 to {max_length} characters")
    if "\x00" in raw:
        raise BadIdError(f"{what} cannot hold a NUL character (U+0000)")
    try:
        return check_text(raw, what)  # the one test of valid text (intents use it too)
    except TextError as exc:
        raise BadIdError(str(exc)) from None
