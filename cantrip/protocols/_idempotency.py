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
from collections.abc import Mapping, Sequence

from cantrip._approval import Pause
from cantrip._entity import CastResult, _cut_text, _truncation_summary
from cantrip.llm._contract import ZERO_USAGE
from cantrip.loom._model import Turn
from cantrip.loom._summary import TurnTree, cast_cost

KEY_TAG = "idempotency_key"
"""The extras field of a cast's first turn that holds its idempotency key."""
MAX_KEY_LENGTH = 255


class BadKeyError(ValueError):
    """An unusable idempotency key."""


def check_key(raw: str) -> str:
    """The key as given (surrounding whitespace aside), if it is 1-255 visible ASCII
    characters -- the ``^[!-~]+$`` that ``/openapi.json`` publishes (no inner spaces)."""
    key = raw.strip()
    if not key or len(key) > MAX_KEY_LENGTH or not all("!" <= c <= "~" for c in key):
        raise BadKeyError(
            f"an Idempotency-Key must be 1-{MAX_KEY_LENGTH} visible ASCII characters (no spaces)"
        )
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


def recorded_cast(turns: Sequence[Turn], start: int, tree: TurnTree) -> CastResult:
    """The cast whose first turn is ``turns[start]``, as the loom recorded it; its cost
    counts the entities it spawned, read from ``tree`` (the loom or the store), as the
    live result's does.

    A cast the process never finished (it was killed) ends on a turn that is
    neither terminated nor truncated; it is reported as truncated with reason
    ``interrupted`` -- unless it ends on a pause, which is reported ``paused`` with
    its pending call (the cast waits for a human to answer)."""
    cast = [turns[start]]
    for turn in turns[start + 1 :]:
        if turn.intent is not None:  # the next cast begins
            break
        cast.append(turn)
    last = cast[-1]
    cost_usd = cast_cost(cast, tree)
    usage = ZERO_USAGE
    for turn in cast:
        usage = usage + turn.metadata.usage
    finished = last.terminated or last.truncated
    reason = last.reason if finished else "interrupted"
    marker = last.extras.get("pending")
    if not finished and isinstance(marker, Mapping):  # it paused: a call waits for a human
        return CastResult(
            result=None,
            terminated=False,
            truncated=False,
            reason="paused",
            entity_id=last.entity_id,
            turns=tuple(cast),
            usage=usage,
            cost_usd=cost_usd,
            pending=(Pause.from_dict(marker, checkpoint_id=last.id),),
        )
    return CastResult(
        result=last.result if last.terminated else None,
        terminated=last.terminated,
        truncated=not last.terminated,
        reason=reason,
        entity_id=last.entity_id,
        turns=tuple(cast),
        usage=usage,
        summary=None if last.terminated else _truncation_summary(cast, reason),
        partial=None if last.terminated else _cut_text(cast),
        cost_usd=cost_usd,
    )
