"""Idempotency keys for session requests: a repeated request returns what the first did.

A client that lost its connection cannot know whether its ``POST`` ran. With an
``Idempotency-Key`` header (draft-ietf-httpapi-idempotency-key-header) it can
simply send the request again:

* **creating a session**: the entity id is derived from the key (a hash), so
  the same key names the same entity -- in this process or, because the
  entity record is in the loom, after a restart;
* **a prompt**: the key is recorded in the extras of the cast's first turn
  (``Entity.send(tags=...)``), so the loom itself says which cast a key
  started. A repeat returns that cast's result, rebuilt from its turns, or
  joins the cast while it still runs.

Nothing here keeps state of its own beyond an index of a session's keys, built
from the loom on first use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cantrip.loom._model import Turn
from cantrip.protocols.sessions._ids import BadIdError, client_id

KEY_TAG = "idempotency_key"
"""The extras field of a cast's first turn that holds its idempotency key."""
MAX_KEY_LENGTH = 255


class BadKeyError(BadIdError):
    """An unusable idempotency key."""


def check_key(raw: str) -> str:
    """The key as given (surrounding whitespace aside), if it is 1-255 visible ASCII
    characters -- the ``^[!-~]+$`` that ``/openapi.json`` publishes (no inner spaces).
    It is a client's id first (:func:`~cantrip.protocols.sessions._ids.client_id`), then ASCII."""
    rule = f"an Idempotency-Key must be 1-{MAX_KEY_LENGTH} visible ASCII characters (no spaces)"
    try:
        key = client_id(raw.strip(), "an Idempotency-Key", MAX_KEY_LENGTH)
    except BadIdError:
        raise BadKeyError(rule) from None
    if not all("!" <= c <= "~" for c in key):
        raise BadKeyError(rule)
    return key


def session_entity_id(key: str) -> str:
    """The entity id a session created with ``key`` gets (the same for the same key)."""
    digest = hashlib.sha256(b"cantrip.session\0" + key.encode()).hexdigest()
    return "entity-" + digest[:20]


def keyed_prompt_id(entity_id: str, key: str) -> str:
    """The id of the prompt sent with ``key`` to the entity's session: the same for a
    repeat, and after a restart, so the id a replayed answer carries is the first's."""
    digest = hashlib.sha256(f"cantrip.prompt\0{entity_id}\0{key}".encode()).hexdigest()
    return "prompt-" + digest[:16]


def key_index(turns: Sequence[Turn]) -> dict[str, str]:
    """Every idempotency key in an entity's turns -> the id of its cast's first turn."""
    index: dict[str, str] = {}
    for turn in turns:
        if turn.intent is not None:
            key = turn.extras.get(KEY_TAG)
            if isinstance(key, str):
                index.setdefault(key, turn.id)
    return index
