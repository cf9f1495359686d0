"""The sessions a loom holds as a list shows them (ACP's ``session/list``): one summary
per top-level entity -- its title (its first intent), when it was last active, and the
working directory its casts recorded -- most recently active first.

Three turns of a session say all of it: the first with an intent, the latest, and the
latest that recorded a ``cwd`` tag. The walk (:func:`summaries_in`) reads every turn
of every session to find them: in process (a loom in memory or a local file) that is
what it always was. On PostgreSQL it was a query per session, every one of its turns
sent over the wire (N+1: 50 sessions, 51 statements); :func:`summaries_on` reads the
three turns of every session in one statement, whatever their number (a session whose
candidate turn proves not to be what was looked for is walked alone), and the two
agree on every summary (``tests/test_acp_list_db.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cantrip.distributed._work import CWD_TAG
from cantrip.loom._codec import decode_record
from cantrip.loom._indexed import TURN_ROW
from cantrip.loom._loom import Loom
from cantrip.loom._model import EntityRecord, Turn
from cantrip.loom._postgres import PostgresStore
from cantrip.protocols.sessions._session import recorded_tag
from cantrip.protocols.sessions._values import TITLE_CHARS, SessionSummary, session_id_for


def _summary(
    record: EntityRecord, first: Turn | None, last: Turn | None, tagged: Sequence[Turn]
) -> SessionSummary:
    """The summary from the entity and its three turns (``first``: the first with an
    intent; ``tagged``: turns the latest ``cwd`` tag is looked for in, latest last)."""
    title = first.intent[:TITLE_CHARS] if first is not None and first.intent else None
    updated = last.metadata.timestamp if last is not None else record.created_at
    cwd = recorded_tag(tagged, CWD_TAG)
    return SessionSummary(session_id_for(record.entity_id), title, updated or None, cwd)


def newest_first(found: Iterable[SessionSummary]) -> list[SessionSummary]:
    return sorted(found, key=lambda s: s.updated_at or "", reverse=True)


def summaries_in(loom: Loom) -> list[SessionSummary]:
    """Every top-level entity of the loom as a session, most recently active first,
    read by walking each one's turns (in process)."""
    found: list[SessionSummary] = []
    for record in loom.entities.values():
        if record.parent_entity_id is not None:
            continue
        turns = loom.entity_turns(record.entity_id)
        first = next((t for t in turns if t.intent), None)
        found.append(_summary(record, first, turns[-1] if turns else None, turns))
    return newest_first(found)


_TURN = "t.entity_id = e.entity_id"
_SUMMARIES = f"""
SELECT e.data,
    f.data, f.id, f.parent_id, f.entity_id, f.sequence,
    l.data, l.id, l.parent_id, l.entity_id, l.sequence,
    c.data, c.id, c.parent_id, c.entity_id, c.sequence
FROM cantrip_entities e
LEFT JOIN LATERAL (
    SELECT {TURN_ROW} FROM cantrip_turns t WHERE {_TURN} AND strpos(t.data, '"intent":') > 0
    ORDER BY t.sequence LIMIT 1
) f ON true
LEFT JOIN LATERAL (
    SELECT {TURN_ROW} FROM cantrip_turns t WHERE {_TURN} ORDER BY t.sequence DESC LIMIT 1
) l ON true
LEFT JOIN LATERAL (
    SELECT {TURN_ROW} FROM cantrip_turns t WHERE {_TURN} AND strpos(t.data, '"{CWD_TAG}":') > 0
    ORDER BY t.sequence DESC LIMIT 1
) c ON true
WHERE e.parent_entity_id IS NULL
ORDER BY e.pos
"""
"""Each top-level entity with its last turn and the candidates for its first intent and
its latest ``cwd`` tag (:data:`TURN_ROW` each, NULLs for none). A candidate is a turn
whose stored JSON (compact, as :func:`~cantrip.loom._codec.encode_record` writes it)
holds the key -- the record's text is searched, not parsed: PostgreSQL's JSON operators
refuse the ``\\u0000`` escape a turn's text may hold. The key may be another object's
(a tool call's arguments): :func:`summaries_on` checks each candidate it decoded."""


def summaries_on(store: PostgresStore) -> list[SessionSummary]:
    """Every top-level entity of the PostgreSQL loom as a session, most recently active
    first: one statement (blocking: the backend runs it in a thread). A session whose
    candidate turn is not what it looked for (the key was another object's, or an
    empty intent) is walked as in process: a read of its own, for it alone."""
    with store.pool.connection() as conn:
        rows = conn.execute(_SUMMARIES).fetchall()

    def turn(row: Sequence[Any]) -> Turn | None:
        return None if row[0] is None else store._read_turn(row)  # the store's decoder

    found = []
    for row in rows:
        record = EntityRecord.from_dict(decode_record(row[0]))
        first, last, tagged = turn(row[1:6]), turn(row[6:11]), turn(row[11:16])
        if (first is not None and not first.intent) or (
            tagged is not None and not isinstance(tagged.extras.get(CWD_TAG), str)
        ):
            turns = store.entity_turns(record.entity_id)
            first, tagged = next((t for t in turns if t.intent), None), None
            found.append(_summary(record, first, last, turns))
            continue
        found.append(_summary(record, first, last, [tagged] if tagged else []))
    return newest_first(found)
