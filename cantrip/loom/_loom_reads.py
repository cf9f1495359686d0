"""Reading the loom: threads, lineages, an entity's turns, and the cache they come from.

Apart from :mod:`cantrip.loom._loom` because reading is its own job: it never
writes, never takes a lease and never waits on a commit -- it only answers from
the in-memory index (a store that replays) or asks an
:class:`~cantrip.loom._indexed.IndexedStore` and caches what it read. The
:class:`~cantrip.loom._loom.Loom` that writes builds on it and owns the state
declared here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, ValuesView
from typing import Any

from cantrip._errors import LoomError
from cantrip.loom._fence import PendingOp
from cantrip.loom._indexed import IndexedStore
from cantrip.loom._model import EntityRecord, Turn

CACHE_TURNS = 200_000
"""Turns an indexed loom keeps in memory before it forgets the oldest it read."""


class LoomReads:
    """The reading half of :class:`~cantrip.loom._loom.Loom` (which sets this state)."""

    _indexed: IndexedStore | None
    _pending: ValuesView[PendingOp]
    _last: dict[str, Turn | None]
    _turns: list[Turn]
    _by_id: dict[str, Turn]
    _children: dict[str | None, str | list[str]]
    _entities: dict[str, EntityRecord]
    _entity_turns: dict[str, list[Turn]]
    _rewards: dict[str, float | None]

    # -- reading -------------------------------------------------------------

    @property
    def turns(self) -> Sequence[Turn]:
        """Every turn, in the order it was recorded (on an indexed store: a full scan)."""
        if self._indexed is not None:
            return tuple(self._indexed.iter_turns())
        return tuple(self._turns)

    def __len__(self) -> int:
        if self._indexed is not None:
            return self._indexed.count_turns()
        return len(self._turns)

    def __iter__(self) -> Iterator[Turn]:
        if self._indexed is not None:
            return self._indexed.iter_turns()
        return iter(tuple(self._turns))

    def _lookup(self, turn_id: str) -> Turn | None:
        turn = self._by_id.get(turn_id)
        if turn is None and self._indexed is not None:
            turn = self._indexed.get_turn(turn_id)
            if turn is not None:
                self._cache(turn)
        return turn

    def get(self, turn_id: str) -> Turn:
        turn = self._lookup(turn_id)
        if turn is None:
            raise LoomError(f"no turn {turn_id!r} in this loom")
        return turn

    def reward(self, turn_id: str) -> float | None:
        if self._indexed is not None:
            return self._indexed.reward(turn_id)
        return self._rewards.get(turn_id)

    def children(self, turn_id: str | None) -> list[Turn]:
        if self._indexed is not None:
            return self._indexed.children(turn_id)
        children = self._children.get(turn_id, ())
        if isinstance(children, str):
            return [self._by_id[children]]
        return [self._by_id[i] for i in children]

    @property
    def entities(self) -> Mapping[str, EntityRecord]:
        if self._indexed is not None:
            records = {r.entity_id: r for r in self._indexed.entities()}
            for entity_id, record in self._entities.items():
                records.setdefault(entity_id, record)  # queued on a deferred store
            return records
        return dict(self._entities)

    def _entity_or_none(self, entity_id: str) -> EntityRecord | None:
        record = self._entities.get(entity_id)
        if record is None and self._indexed is not None:
            record = self._indexed.get_entity(entity_id)
            if record is not None:
                self._entities[entity_id] = record
        return record

    def has_entity(self, entity_id: str) -> bool:
        return self._entity_or_none(entity_id) is not None

    def has_turn(self, turn_id: str) -> bool:
        return self._lookup(turn_id) is not None

    def entity(self, entity_id: str) -> EntityRecord:
        record = self._entity_or_none(entity_id)
        if record is None:
            raise LoomError(f"no entity {entity_id!r} in this loom")
        return record

    def entity_turns(self, entity_id: str) -> Sequence[Turn]:
        if self._indexed is not None:
            return self._with_pending(entity_id, self._indexed.entity_turns(entity_id))
        return tuple(self._entity_turns.get(entity_id, ()))

    def entity_turns_from(self, entity_id: str, turn_id: str) -> Sequence[Turn]:
        """``entity_id``'s turns from ``turn_id`` (one of them) on, in order; empty if it
        has no such turn. On a store that is queried, a range read: what happened since
        a turn costs what was recorded since, not the entity's whole history."""
        if self._indexed is not None:
            stored = self._indexed.entity_turns_from(entity_id, turn_id)
            if stored:
                return self._with_pending(entity_id, stored)
            # the turn itself may be queued on a deferred store, not committed yet
            turns = [p for k, p, _ in self._pending if k == "turn" and p.entity_id == entity_id]
        else:
            turns = self._entity_turns.get(entity_id, [])
        for position in range(len(turns) - 1, -1, -1):  # recent casts are asked for most
            if turns[position].id == turn_id:
                return tuple(turns[position:])
        return ()

    def _with_pending(self, entity_id: str, stored: list[Turn]) -> tuple[Turn, ...]:
        """Stored turns plus ``entity_id``'s turns queued on a deferred store, not committed yet."""
        if self._pending:
            seen = {t.id for t in stored}
            stored.extend(
                p
                for k, p, _ in self._pending
                if k == "turn" and p.entity_id == entity_id and p.id not in seen
            )
        return tuple(stored)

    def last_turn(self, entity_id: str) -> Turn | None:
        if self._indexed is not None:
            if entity_id in self._last:
                return self._last[entity_id]
            turn = self._indexed.last_turn(entity_id)
            if turn is not None:
                self._cache(turn)
            return turn
        turns = self._entity_turns.get(entity_id)
        return turns[-1] if turns else None

    def refresh(self, entity_id: str) -> tuple[EntityRecord | None, Turn | None]:
        """Read ``entity_id``'s record, latest turn and that turn's thread from the store
        into the cache: a worker does this (in a thread) before running an entity that
        another worker may have written last. Returns (record, latest turn)."""
        self._last.pop(entity_id, None)
        self._entities.pop(entity_id, None)
        record = self._entity_or_none(entity_id)
        if self._indexed is None:
            return record, self.last_turn(entity_id)
        last = self._indexed.last_turn(entity_id)
        self._last[entity_id] = last
        if last is not None:
            for turn in self._indexed.thread(last.id):
                self._cache(turn)
        return record, last

    @property
    def identity(self) -> Mapping[str, Any] | None:
        """The root context: the identity of the first top-level entity (IDENTITY-4)."""
        entities = self.entities if self._indexed is not None else self._entities
        for record in entities.values():
            if record.parent_entity_id is None:
                return record.identity
        return None

    def _warm(self, leaf_id: str) -> None:
        """Indexed mode: fetch a thread in one query if its leaf is not cached."""
        if self._indexed is not None and leaf_id not in self._by_id:
            for turn in self._indexed.thread(leaf_id):
                self._cache(turn)

    def thread(self, leaf_id: str) -> list[Turn]:
        """The root-to-leaf path ending at ``leaf_id`` (LOOM-10)."""
        self._warm(leaf_id)
        path: list[Turn] = []
        current: str | None = leaf_id
        while current is not None:
            turn = self.get(current)
            path.append(turn)
            current = turn.parent_id
        path.reverse()
        return path

    def lineage(self, leaf_id: str) -> list[Turn]:
        """The part of the thread ending at ``leaf_id`` that its entity's context
        is rendered from: the thread, cut just below the delegation checkpoint
        that spawned the leaf's lineage (a child never saw its parent's turns).

        For a top-level entity this is the whole thread; for a fork it includes
        the prefix it was forked from (LOOM-4); for a child -- or a fork of a
        child -- it starts at the child's root turn. O(depth).
        """
        self._warm(leaf_id)
        path: list[Turn] = []
        current = self.get(leaf_id)
        while True:
            path.append(current)
            parent_id = current.parent_id
            if parent_id is None:
                break
            parent = self.get(parent_id)
            if parent.entity_id != current.entity_id:
                record = self._entity_or_none(current.entity_id)
                if record is not None and record.spawned_from == parent_id:
                    break
            current = parent
        path.reverse()
        return path

    def find(self, where: str, sequence: int) -> Turn:
        """The turn with ``sequence`` on a thread, as its entity counts turns.

        ``where`` is an entity id (its latest thread) or a turn id (the thread
        ending there). A fork's thread includes the prefix it was forked from,
        so sequence 1 of a fork is the first turn of the original.
        """
        if self._entity_or_none(where) is not None:
            last = self.last_turn(where)
            if last is None:
                raise LoomError(f"entity {where!r} has no turns yet")
            where = last.id
        for turn in self.lineage(where):
            if turn.sequence == sequence:
                return turn
        raise LoomError(f"no turn with sequence {sequence} on the thread of {where!r}")

    def leaves(self) -> list[Turn]:
        """Turns without children, in the order they were recorded."""
        if self._indexed is not None:
            return self._indexed.leaves()
        return [t for t in self._turns if not self._children.get(t.id)]

    def threads(self) -> list[list[Turn]]:
        """Every root-to-leaf path, ordered by when its leaf was recorded."""
        return [self.thread(leaf.id) for leaf in self.leaves()]

    def forget(self, entity_ids: Sequence[str]) -> None:
        """Drop what this process remembers of entities its store no longer holds
        (removed by retention, :mod:`cantrip.loom._retention`, while this loom is
        open): their records and cached turns, so a read asks the store again."""
        gone = set(entity_ids)
        for entity_id in gone:
            self._entities.pop(entity_id, None)
            self._last.pop(entity_id, None)
        for turn_id in [t for t, turn in self._by_id.items() if turn.entity_id in gone]:
            del self._by_id[turn_id]

    # -- index ---------------------------------------------------------------

    def _index_entity(self, record: EntityRecord) -> None:
        self._entities[record.entity_id] = record
        if self._indexed is None:
            self._entity_turns.setdefault(record.entity_id, [])

    def _cache(self, turn: Turn) -> None:
        by_id = self._by_id
        if len(by_id) >= CACHE_TURNS:
            del by_id[next(iter(by_id))]  # the oldest read or written
        by_id[turn.id] = turn

    def _index_turn(self, turn: Turn) -> None:
        if self._indexed is not None:
            self._cache(turn)
            self._last[turn.entity_id] = turn
            return
        self._turns.append(turn)
        self._by_id[turn.id] = turn
        siblings = self._children.get(turn.parent_id)
        if siblings is None:
            self._children[turn.parent_id] = turn.id
        elif isinstance(siblings, str):
            self._children[turn.parent_id] = [siblings, turn.id]
        else:
            siblings.append(turn.id)
        self._entity_turns.setdefault(turn.entity_id, []).append(turn)
