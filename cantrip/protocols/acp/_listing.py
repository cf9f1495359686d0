"""``session/list``: the sessions the loom holds, as the backend summarises them.

A session is a top-level entity (``session-<hex>`` names ``entity-<hex>``), so the
list is the loom's top-level entities -- those of earlier processes too: what a client
lists it can ``session/resume`` or ``session/load``. The backend reads them
(``SessionBackend.summaries``: on PostgreSQL one statement for every session, not one
per session). Each reports the working directory it was created in (``session/new``'s
``cwd``), which its casts record as their ``cwd`` tag; a session made without one (over
HTTP, say) reports the agent's own. ``session/delete`` is the backend's ``delete``: its
whole tree removed from the loom by the retention rule
(:func:`cantrip.loom._retention.prune`, ``entity=``): never part of a thread, never a
tree another entity was forked from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cantrip.protocols.sessions._values import SessionSummary

PAGE = 100
"""Sessions per ``session/list`` page (the cursor is the offset of the next page)."""


def where(listed: SessionSummary, agent_cwd: str) -> str:
    """A session's working directory: the recorded one, else the agent's own."""
    return listed.cwd if listed.cwd is not None else agent_cwd


def to_dict(listed: SessionSummary, agent_cwd: str) -> dict[str, Any]:
    """ACP's ``SessionInfo`` of a listed session."""
    data: dict[str, Any] = {"sessionId": listed.session_id, "cwd": where(listed, agent_cwd)}
    if listed.title is not None:
        data["title"] = listed.title
    if listed.updated_at:
        data["updatedAt"] = listed.updated_at
    return data


def page(listed: list[SessionSummary], cursor: Any) -> tuple[list[SessionSummary], str | None]:
    """One page from ``cursor`` (None: the first), and the next page's cursor."""
    start = 0
    if cursor is not None:
        if not isinstance(cursor, str) or not cursor.isdigit():
            raise ValueError("cursor must be one a session/list answer gave")
        start = int(cursor)
    chunk = listed[start : start + PAGE]
    more = start + PAGE < len(listed)
    return chunk, str(start + PAGE) if more else None


def in_cwd(
    listed: list[SessionSummary], params: Mapping[str, Any], agent_cwd: str
) -> list[SessionSummary]:
    """The sessions a ``session/list`` filter by ``cwd`` keeps: those created there."""
    asked = params.get("cwd")
    if asked is None:
        return listed
    return [s for s in listed if where(s, agent_cwd) == asked]
