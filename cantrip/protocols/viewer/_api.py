"""The loom viewer's read model: paged JSON views of a loom for the browser.

The browser viewer (``cantrip loom FILE view``, and ``/`` of ``cantrip serve``)
reads the loom only through these functions, which compute what ``cantrip loom
list`` and ``show`` compute (:mod:`cantrip.cli._loom`'s tokens, cost and
outcome helpers); a turn is the export's record
(:func:`~cantrip.protocols.sessions._hub.turn_dict`). What goes out is redacted by the
one sender every viewer answer passes (:func:`~cantrip.protocols.viewer._app.send_json`),
not here. Nothing here writes to the loom.

Every list is paged (``offset``, ``limit``, ``total``): the server never sends a
whole loom at once, so a 10,000-turn loom costs the browser one page. The
derived indexes (entity summaries, an entity's flattened tree, a cast's timeline:
:mod:`._timeline`) are built once
per loom *size* -- the loom is append-only, so a new turn or entity is the only
thing that can change them -- and cached until the next append.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from cantrip._errors import LoomError
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._summary import cost as _cost
from cantrip.loom._summary import outcome as _outcome
from cantrip.loom._summary import tokens as _tokens
from cantrip.loom._summary import tree_turns as _tree_turns
from cantrip.loom._summary import turn_cost
from cantrip.protocols.sessions import session_id_for, turn_dict
from cantrip.protocols.viewer._compare import compare
from cantrip.protocols.viewer._errors import ViewerError
from cantrip.protocols.viewer._evals import eval_cases, eval_pairs, eval_runs, is_run_record
from cantrip.protocols.viewer._timeline import CastTimeline, turn_status

__all__ = ["LoomViews", "TreeRow", "ViewerError", "page_args", "turn_status"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
PREVIEW = 160


class TreeRow(NamedTuple):
    """One line of an entity's loom tree, flattened in display order (a tuple:
    a 10,000-turn tree is 10,000 of these, built on the first read)."""

    turn: Turn
    depth: int
    branch: str | None
    """``"child"`` (the first turn of a call_agent child), ``"fork"`` (the first
    turn of a fork), ``"rollback"`` (the first turn of a branch of the entity's own
    that its thread no longer goes through: rewound, double-texting's rollback),
    or ``None`` (the thread goes on)."""


def page_args(query: Mapping[str, Sequence[str]]) -> tuple[int, int]:
    """``offset`` and ``limit`` from a query string; bad values are a 400, not a guess."""

    def number(name: str, default: int) -> int:
        values = query.get(name)
        if not values:
            return default
        try:
            value = int(values[-1])
        except ValueError:
            raise ViewerError(400, "bad_request", f"{name} must be a whole number") from None
        if value < 0:
            raise ViewerError(400, "bad_request", f"{name} must not be negative")
        return value

    return number("offset", 0), max(1, min(number("limit", DEFAULT_LIMIT), MAX_LIMIT))


def _short(text: str | None, limit: int = PREVIEW) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_ephemeral(turn: Turn) -> bool:
    return any(r.detail.get("ephemeral") for r in turn.gate_calls)


class _Index:
    """One scan of the loom, grouped the ways the viewer reads it: every
    entity's turns and every turn's children, in recording order. Built once
    per loom size, so the reads below never ask the store turn by turn (on an
    indexed store each ``children()`` would be a query)."""

    def __init__(self, loom: Loom) -> None:
        self.by_entity: dict[str, list[Turn]] = {}
        self.children: dict[str | None, list[Turn]] = {}
        self.entity_of: dict[str, str] = {}
        self.by_id: dict[str, Turn] = {}
        for turn in loom.turns:
            self.by_entity.setdefault(turn.entity_id, []).append(turn)
            self.children.setdefault(turn.parent_id, []).append(turn)
            self.entity_of[turn.id] = turn.entity_id
            self.by_id[turn.id] = turn

    def live_thread(self, entity_id: str) -> set[str]:
        """The ids of ``entity_id``'s own turns on the path to its latest turn."""
        turns = self.by_entity.get(entity_id)
        ids: set[str] = set()
        current = turns[-1] if turns else None
        while current is not None and current.entity_id == entity_id:
            ids.add(current.id)
            current = self.by_id.get(current.parent_id) if current.parent_id else None
        return ids

    def turns_of(self, entity_id: str) -> Sequence[Turn]:
        return self.by_entity.get(entity_id, ())


class LoomViews:
    """The viewer's paged reads of one loom (the loom may grow between calls).

    ``running`` says whether an entity has a cast in flight (a live server
    knows; a loom file does not), ``live`` whether the page may steer
    entities (prompt, cancel, fork)."""

    def __init__(
        self,
        loom: Callable[[], Loom],
        *,
        live: bool = False,
        running: Callable[[str], bool] | None = None,
        source: str | None = None,
    ) -> None:
        self._loom = loom
        self.live = live
        self.running: Callable[[str], bool] = running or (lambda _entity_id: False)
        """Whether an entity runs a prompt now (a live viewer sets it before a read)."""
        self.source = source
        self._cache_key: tuple[int, int, int] | None = None
        self._summaries: list[dict[str, Any]] = []
        self._search: list[str] = []
        self._trees: dict[str, list[TreeRow]] = {}
        self._timelines: dict[str, CastTimeline] = {}
        self._scan: _Index | None = None

    @property
    def loom(self) -> Loom:
        return self._loom()

    def _fresh(self) -> Loom:
        """The loom, with the caches dropped if it has grown since they were built."""
        loom = self._loom()
        key = (id(loom), len(loom), len(loom.entities))
        if key != self._cache_key:
            self._cache_key = key
            self._summaries = []
            self._search = []
            self._trees = {}
            self._timelines = {}
            self._scan = None
        return loom

    def _index(self, loom: Loom) -> _Index:
        if self._scan is None:
            self._scan = _Index(loom)
        return self._scan

    # -- the loom and its entities ------------------------------------------------

    def overview(self) -> dict[str, Any]:
        loom = self._fresh()
        return {
            "turns": len(loom),
            "entities": sum(1 for r in loom.entities.values() if not is_run_record(r)),
            "live": self.live,
            "source": self.source,
        }

    def entities(self, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """Entities, most recently active first; ``q`` filters by id or intent text."""
        offset, limit = page_args(query)
        loom = self._fresh()
        if not self._summaries:
            self._build_summaries(loom)
        needle = (query.get("q") or [""])[-1].strip().lower()
        rows = self._summaries
        if needle:
            rows = [s for s, text in zip(rows, self._search, strict=True) if needle in text]
        page = [
            {**row, "running": self.running(row["entity_id"])}
            for row in rows[offset : offset + limit]
        ]
        return {"total": len(rows), "offset": offset, "limit": limit, "items": page}

    # -- eval runs (:mod:`._evals`: read from the runs' records, never the turns) -----

    def evals(self, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """The eval runs this loom records, newest first, with pass/fail counts."""
        return eval_runs(self._loom(), *page_args(query))

    def eval_run(self, run_id: str, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """A page of one run's cases, filtered by ``status`` and ``name``."""
        return eval_cases(self._loom(), run_id, query, *page_args(query))

    def eval_pairs(self, a: str, b: str, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """Two runs' cases paired by name and repeat, for Compare."""
        return eval_pairs(self._loom(), a, b, query, *page_args(query))

    def _build_summaries(self, loom: Loom) -> None:
        index = self._index(loom)
        records = [r for r in loom.entities.values() if not is_run_record(r)]
        summaries: list[tuple[str, dict[str, Any], str]] = []
        for record in records:
            turns = index.turns_of(record.entity_id)
            last = turns[-1] if turns else None
            intents = [t.intent for t in turns if t.intent]
            activity = last.metadata.timestamp if last is not None else ""
            summary: dict[str, Any] = {
                "entity_id": record.entity_id,
                "session_id": (
                    session_id_for(record.entity_id) if record.parent_entity_id is None else None
                ),
                "medium": record.medium,
                "llm": record.llm,
                "parent_entity_id": record.parent_entity_id,
                "forked_from": record.forked_from,
                "status": turn_status(last) if last is not None else "new",
                "outcome": _outcome(last) if last is not None else "no turns",
                "turns": len(turns),
                "tokens": _tokens(turns),
                "cost_usd": _cost(turns),
                "tree_cost_usd": _cost(
                    _tree_turns(loom, record.entity_id, entities=records, turns_of=index.turns_of)
                ),
                "intent": _short(intents[0]) if intents else "",
                "last_activity": activity or record.created_at,
                "created_at": record.created_at,
            }
            tag = turns[0].extras.get("eval") if turns else None
            if isinstance(tag, Mapping):  # a case of a `cantrip eval` run
                summary["eval"] = {k: tag.get(k) for k in ("run", "case", "repeat")}
            words = [str(tag.get("run")), str(tag.get("case"))] if isinstance(tag, Mapping) else []
            search = " ".join([record.entity_id, *intents, *words]).lower()
            summaries.append((str(summary["last_activity"]), summary, search))
        summaries.sort(key=lambda item: item[0], reverse=True)
        self._summaries = [s for _, s, _ in summaries]
        self._search = [text for _, _, text in summaries]

    # -- an entity's tree ------------------------------------------------------------

    def tree(self, entity_id: str, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """A page of the entity's loom tree, flattened in display order.

        ``turn=ID`` (instead of ``offset``) returns the page holding that turn."""
        offset, limit = page_args(query)
        loom = self._fresh()
        record = self._entity(loom, entity_id)
        rows = self._trees.get(entity_id)
        if rows is None:
            rows = self._trees[entity_id] = self._flatten(loom, self._index(loom), entity_id)
        turn_values = query.get("turn")
        wanted = turn_values[-1] if turn_values else None
        index = None
        if wanted:
            index = next((i for i, r in enumerate(rows) if r.turn.id == wanted), None)
            if index is None:
                raise ViewerError(404, "unknown_turn", f"turn {wanted!r} is not in this tree")
            offset = index - index % limit
        items = [self._row(loom, row) for row in rows[offset : offset + limit]]
        return {
            "entity_id": entity_id,
            "total": len(rows),
            "offset": offset,
            "limit": limit,
            "index": index,
            "forked_from": record.forked_from,
            "items": items,
        }

    @staticmethod
    def _entity(loom: Loom, entity_id: str) -> Any:
        try:
            return loom.entity(entity_id)
        except LoomError:
            raise ViewerError(404, "unknown_entity", f"no entity {entity_id!r}") from None

    @staticmethod
    def _flatten(loom: Loom, index: _Index, entity_id: str) -> list[TreeRow]:
        """Depth-first: a turn, its call_agent children's subtrees, its forks'
        subtrees (each one level deeper), then the rest of its own thread at the
        same depth -- so a 10,000-turn thread is 10,000 rows at depth 0, not a
        10,000-level staircase. Iterative: no recursion limit."""
        entities = loom.entities
        entity_of = index.entity_of
        live: dict[str, set[str]] = {}

        def on_thread(turn: Turn) -> bool:
            """Whether ``turn`` is on its entity's thread now (the path to its latest turn)."""
            ids = live.get(turn.entity_id)
            if ids is None:
                ids = live[turn.entity_id] = index.live_thread(turn.entity_id)
            return turn.id in ids

        roots = [
            t
            for t in index.turns_of(entity_id)
            if t.parent_id is None or entity_of.get(t.parent_id) != entity_id
        ]
        no_children: list[Turn] = []
        stack: list[TreeRow] = [
            TreeRow(t, 0, None if i == 0 or on_thread(t) else "rollback")
            for i, t in reversed(list(enumerate(roots)))
        ]
        rows: list[TreeRow] = []
        while stack:
            row = stack.pop()
            rows.append(row)
            turn = row.turn
            own: list[Turn] = []
            spawned: list[Turn] = []
            forks: list[Turn] = []
            for child in index.children.get(turn.id, no_children):
                if child.entity_id == turn.entity_id:
                    own.append(child)
                    continue
                record = entities.get(child.entity_id)
                if record is not None and record.spawned_from == turn.id:
                    spawned.append(child)
                else:
                    forks.append(child)
            # The thread goes on through the child on the entity's thread now; a
            # branch it was rewound from is drawn after this turn, one level deeper.
            mainline = next((t for t in own if on_thread(t)), own[0] if own else None)
            if mainline is not None:
                stack.append(TreeRow(mainline, row.depth, None))
            rolled = [t for t in own if t is not mainline]
            branches = [(t, "rollback") for t in rolled] + [(t, "fork") for t in forks]
            stack.extend(TreeRow(t, row.depth + 1, kind) for t, kind in reversed(branches))
            if spawned:
                stack.extend(TreeRow(t, row.depth + 1, "child") for t in reversed(spawned))
        return rows

    def _row(self, loom: Loom, row: TreeRow) -> dict[str, Any]:
        turn = row.turn
        meta = turn.metadata
        data = {
            "id": turn.id,
            "parent_id": turn.parent_id,
            "entity_id": turn.entity_id,
            "sequence": turn.sequence,
            "depth": row.depth,
            "branch": row.branch,
            "intent": _short(turn.intent),
            "preview": _short(turn.content or turn.utterance),
            "gates": [r.gate for r in turn.gate_calls],
            "status": turn_status(turn),
            "reason": turn.reason,
            "phase": turn.extras.get("phase"),
            "ephemeral": _is_ephemeral(turn),
            "tokens": meta.tokens_prompt + meta.tokens_completion,
            "duration_ms": meta.duration_ms,
            "cost_usd": turn_cost(turn),
            "reward": loom.reward(turn.id),
            "timestamp": meta.timestamp,
        }
        return data

    # -- a cast's timeline -------------------------------------------------------------

    def timeline(self, entity_id: str, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """A page of the waterfall of ``entity_id`` and every entity it spawned (rows:
        ``offset``, ``limit``), each row's bars inside the window ``from``..``to`` (ms
        since the first turn began) at ``px`` ms a pixel (:mod:`._timeline`)."""
        offset, limit = page_args(query)
        loom = self._fresh()
        self._entity(loom, entity_id)
        timeline = self._timelines.get(entity_id)
        if timeline is None:
            timeline = self._timelines[entity_id] = CastTimeline(loom, entity_id, loom.entities)
        return {"entity_id": entity_id, **timeline.page(offset, limit, query)}

    # -- two threads side by side -----------------------------------------------------

    def compare(self, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """The threads ending at ``a`` and ``b`` (turn or entity ids), aligned from their
        common ancestor, paged by pair (:mod:`._compare`)."""
        offset, limit = page_args(query)
        refs = [(query.get(name) or [""])[-1].strip() for name in ("a", "b")]
        if not all(refs):
            raise ViewerError(400, "bad_request", "name both threads: ?a=TURN_OR_ENTITY&b=...")
        return compare(self._fresh(), refs[0], refs[1], offset, limit)

    # -- one turn, one thread ---------------------------------------------------------

    def turn(self, turn_id: str) -> dict[str, Any]:
        """Everything recorded about one turn (the export's redacted record), plus
        what the page needs around it: the entity's medium, the branches that
        start here, and whether the entity can be prompted."""
        loom = self._fresh()
        turn = self._turn(loom, turn_id)
        record = loom.entity(turn.entity_id)
        entities = loom.entities
        branches = []
        children = loom.children(turn.id)
        live: set[str] = set()
        if sum(c.entity_id == turn.entity_id for c in children) > 1:  # rewound here
            last = loom.last_turn(turn.entity_id)
            live = {t.id for t in loom.thread(last.id)} if last is not None else set()
        for child in children:
            if child.entity_id == turn.entity_id:
                kind = "next" if not live or child.id in live else "rollback"
            elif getattr(entities.get(child.entity_id), "spawned_from", None) == turn.id:
                kind = "child"
            else:
                kind = "fork"
            branches.append({"id": child.id, "entity_id": child.entity_id, "branch": kind})
        data = turn_dict(turn)
        data.update(
            reward=loom.reward(turn.id),
            status=turn_status(turn),
            cost=turn_cost(turn),
            ephemeral=_is_ephemeral(turn),
            medium=record.medium,
            parent_entity_id=record.parent_entity_id,
            session_id=(
                session_id_for(record.entity_id) if record.parent_entity_id is None else None
            ),
            branches=branches,
        )
        return data

    def thread(self, turn_id: str, query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
        """The thread from the root to ``turn_id`` as a chat transcript, paged by turn."""
        offset, limit = page_args(query)
        loom = self._fresh()
        turns = loom.thread(self._turn(loom, turn_id).id)
        messages: list[dict[str, Any]] = []
        for turn in turns[offset : offset + limit]:
            messages.extend(_transcript(turn))
        return {
            "leaf": turn_id,
            "total": len(turns),
            "offset": offset,
            "limit": limit,
            "messages": messages,
        }

    @staticmethod
    def _turn(loom: Loom, turn_id: str) -> Turn:
        try:
            return loom.get(turn_id)
        except LoomError:
            raise ViewerError(404, "unknown_turn", f"no turn {turn_id!r}") from None


def _transcript(turn: Turn) -> list[dict[str, Any]]:
    """One turn as chat messages: the intent (if the turn opened a cast), the
    entity's reply, one message per gate call, and the outcome."""
    base = {"turn_id": turn.id, "entity_id": turn.entity_id, "sequence": turn.sequence}
    out: list[dict[str, Any]] = []
    if turn.intent is not None:
        out.append({**base, "role": "user", "text": turn.intent})
    out.append(
        {
            **base,
            "role": "assistant",
            "text": turn.content if turn.content is not None else turn.utterance,
            "thinking": turn.thinking,
        }
    )
    for r in turn.gate_calls:
        out.append(
            {
                **base,
                "role": "tool",
                "gate": r.gate,
                "args": r.to_dict()["args"],
                "text": r.text,
                "status": r.status,
                "is_error": r.is_error,
            }
        )
    if turn.terminated or turn.truncated:
        out.append(
            {
                **base,
                "role": "outcome",
                "status": turn_status(turn),
                "reason": turn.reason,
                "result": turn_dict(turn)["result"] if turn.terminated else None,
            }
        )
    return out
