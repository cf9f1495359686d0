"""``session/list`` and ``session/delete``: the sessions the loom holds, read and removed
where the loom is.

A session is a top-level entity (``session-<hex>`` names ``entity-<hex>``), so the
list is the loom's top-level entities -- those of earlier processes too: what a client
lists it can ``session/resume`` or ``session/load``. Each reports the working
directory it was created in (``session/new``'s ``cwd``), which its casts record as their
``cwd`` tag; a session made without one (over HTTP, say) reports the agent's own.
Deleting one removes its whole tree from the loom by the retention rule
(:func:`cantrip.loom._retention.prune`, ``entity=``): never part of a thread, never a
tree another entity was forked from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from cantrip.distributed._work import CWD_TAG
from cantrip.loom._loom import Loom
from cantrip.protocols.sessions._backend import session_id_for
from cantrip.protocols.sessions._session import recorded_tag

PAGE = 100
"""Sessions per ``session/list`` page (the cursor is the offset of the next page)."""
TITLE_CHARS = 80


@attrs.frozen
class Listed:
    session_id: str
    title: str | None
    updated_at: str | None
    cwd: str | None = None
    """Where it was created (its casts' ``cwd`` tag); None: not recorded."""

    def where(self, agent_cwd: str) -> str:
        """Its working directory: the recorded one, else the agent's own."""
        return self.cwd if self.cwd is not None else agent_cwd

    def to_dict(self, agent_cwd: str) -> dict[str, Any]:
        data: dict[str, Any] = {"sessionId": self.session_id, "cwd": self.where(agent_cwd)}
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
        cwd = recorded_tag(turns, CWD_TAG)
        found.append(Listed(session_id_for(entity_id), title, updated or None, cwd))
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


def in_cwd(listed: list[Listed], params: Mapping[str, Any], agent_cwd: str) -> list[Listed]:
    """The sessions a ``session/list`` filter by ``cwd`` keeps: those created there."""
    asked = params.get("cwd")
    if asked is None:
        return listed
    return [s for s in listed if s.where(agent_cwd) == asked]
