"""``session/list`` and ``session/delete``: the sessions the loom holds, read and removed
where the loom is.

A session is a top-level entity (``session-<hex>`` names ``entity-<hex>``), so the
list is the loom's top-level entities -- those of earlier processes too: what a client
lists it can ``session/resume`` or ``session/load``. Deleting one removes its whole
tree from the loom by the retention rule (:func:`cantrip.loom._retention.prune`,
``entity=``): never part of a thread, never a tree another entity was forked from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from cantrip.loom._loom import Loom
from cantrip.protocols.sessions._backend import session_id_for

PAGE = 100
"""Sessions per ``session/list`` page (the cursor is the offset of the next page)."""
TITLE_CHARS = 80


@attrs.frozen
class Listed:
    session_id: str
    title: str | None
    updated_at: str | None

    def to_dict(self, cwd: str) -> dict[str, Any]:
        data: dict[str, Any] = {"sessionId": self.session_id, "cwd": cwd}
        if self.title is not None:
            data["title"] = self.title
        if self.updated_at:
            data["updatedAt"] = self.updated_at
        return data


def sessions_in(loom: Loom) -> list[Listed]:
    """Every top-level entity of the loom as a session, most recently active first."""
    found: list[Listed] = []
    for entity_id, record in loom.entities.items():
        if record.parent_entity_id is not None:
            continue
        turns = loom.entity_turns(entity_id)
        first = next((t.intent for t in turns if t.intent), None)
        title = first[:TITLE_CHARS] if first else None
        updated = turns[-1].metadata.timestamp if turns else record.created_at
        found.append(Listed(session_id_for(entity_id), title, updated or None))
    found.sort(key=lambda s: s.updated_at or "", reverse=True)
    return found


def page(listed: list[Listed], cursor: Any) -> tuple[list[Listed], str | None]:
    """One page from ``cursor`` (None: the first), and the next page's cursor."""
    start = 0
    if cursor is not None:
        if not isinstance(cursor, str) or not cursor.isdigit():
            raise ValueError("cursor must be one a session/list answer gave")
        start = int(cursor)
    chunk = listed[start : start + PAGE]
    more = start + PAGE < len(listed)
    return chunk, str(start + PAGE) if more else None


def cwd_matches(params: Mapping[str, Any], cwd: str) -> bool:
    """Whether a ``session/list`` filter by ``cwd`` keeps this agent's sessions: they
    all run in the directory the agent was started in."""
    asked = params.get("cwd")
    return asked is None or asked == cwd
