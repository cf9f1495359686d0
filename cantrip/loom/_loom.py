"""The loom: the append-only tree of every turn of an execution tree (chapter 6).

One loom serves a whole execution tree -- the entity, its children, forks and
later casts (D-008). Turns link to their parents; a thread is any root-to-leaf
path and is extracted by walking parent links, O(depth).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cantrip._errors import LoomAppendOnlyError, LoomError
from cantrip.loom._model import EntityRecord, Turn
from cantrip.loom._stores import LoomStore, MemoryStore, open_store


class Loom:
    """The tree of turns, indexed in memory, made durable by a :class:`LoomStore`."""

    def __init__(self, store: LoomStore | None = None) -> None:
        self.store: LoomStore = store if store is not None else MemoryStore()
        self._turns: list[Turn] = []
        self._by_id: dict[str, Turn] = {}
        self._children: dict[str | None, str | list[str]] = {}
        """Child turn ids by parent id: a lone child as its id, siblings (forks,
        several roots) as a list -- most turns have one child, and a list per
        turn would be one more object per turn for the collector to track."""
        self._entities: dict[str, EntityRecord] = {}
        self._entity_turns: dict[str, list[Turn]] = {}
        self._rewards: dict[str, float | None] = {}
        try:
            self._load()
        except BaseException:
            self.store.close()
            raise

    def _load(self) -> None:
        for kind, payload in self.store.load():
            if kind == "entity":
                assert isinstance(payload, EntityRecord)
                self._index_entity(payload)
            elif kind == "turn":
                assert isinstance(payload, Turn)
                self._index_turn(payload)
            else:
                turn_id, reward = payload  # type: ignore[misc]
                self._rewards[turn_id] = reward

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Loom:
        """Open (or create) a loom file: ``*.jsonl`` as JSONL, anything else as SQLite.

        A file that is not a loom is refused before anything is written to it,
        and a damaged one is a :class:`LoomError` that says how to recover what
        it holds (``cantrip.loom._repair``)."""
        from cantrip.loom._repair import damaged_hint, ensure_loom

        if str(path) != ":memory:":
            ensure_loom(path)
        try:
            return cls(open_store(path))
        except sqlite3.DatabaseError as exc:
            raise LoomError(f"{path} is a damaged loom ({exc}); {damaged_hint(path)}") from None

    def close(self) -> None:
        self.store.close()

    # -- writing -------------------------------------------------------------

    @staticmethod
    def new_turn_id() -> str:
        """``turn-`` and 128 bits: a 48-bit millisecond clock, then 80 random bits.

        Ids of one process sort roughly by creation time, so a store's id index
        grows at its end instead of at random places (cheaper appends)."""
        return f"turn-{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"

    def register_entity(self, record: EntityRecord) -> None:
        if record.entity_id in self._entities:
            raise LoomAppendOnlyError(
                f"loom is append-only: entity {record.entity_id} is already recorded"
            )
        self.store.append_entity(record)
        self._index_entity(record)

    def append(self, turn: Turn) -> Turn:
        """Record ``turn`` durably. Its parent must already be in the loom."""
        if turn.id in self._by_id:
            raise LoomAppendOnlyError(f"loom is append-only: turn {turn.id} already exists")
        if turn.parent_id is not None and turn.parent_id not in self._by_id:
            raise LoomError(f"turn {turn.id} names unknown parent {turn.parent_id}")
        if turn.entity_id not in self._entities:
            raise LoomError(f"turn {turn.id} belongs to unregistered entity {turn.entity_id}")
        self.store.append_turn(turn)
        self._index_turn(turn)
        return turn

    def annotate_reward(self, turn_id: str, reward: float | None) -> None:
        """Assign or update a turn's reward -- the one change LOOM-3 allows."""
        self.get(turn_id)
        self.store.set_reward(turn_id, reward)
        self._rewards[turn_id] = reward

    def delete_turn(self, turn_id: str) -> None:
        """Always refused: the loom is append-only (LOOM-3)."""
        raise LoomAppendOnlyError(
            f"loom is append-only: turn {turn_id} cannot be deleted (fork instead)"
        )

    def replace_turn(self, turn_id: str, turn: Turn) -> None:
        """Always refused: the loom is append-only (LOOM-3)."""
        raise LoomAppendOnlyError(
            f"loom is append-only: turn {turn_id} cannot be modified (annotate a reward or fork)"
        )

    # -- reading -------------------------------------------------------------

    @property
    def turns(self) -> Sequence[Turn]:
        """Every turn, in the order it was recorded."""
        return tuple(self._turns)

    def __len__(self) -> int:
        return len(self._turns)

    def __iter__(self) -> Iterator[Turn]:
        return iter(tuple(self._turns))

    def get(self, turn_id: str) -> Turn:
        try:
            return self._by_id[turn_id]
        except KeyError:
            raise LoomError(f"no turn {turn_id!r} in this loom") from None

    def reward(self, turn_id: str) -> float | None:
        return self._rewards.get(turn_id)

    def children(self, turn_id: str | None) -> list[Turn]:
        children = self._children.get(turn_id, ())
        if isinstance(children, str):
            return [self._by_id[children]]
        return [self._by_id[i] for i in children]

    @property
    def entities(self) -> Mapping[str, EntityRecord]:
        return dict(self._entities)

    def entity(self, entity_id: str) -> EntityRecord:
        try:
            return self._entities[entity_id]
        except KeyError:
            raise LoomError(f"no entity {entity_id!r} in this loom") from None

    def entity_turns(self, entity_id: str) -> Sequence[Turn]:
        return tuple(self._entity_turns.get(entity_id, ()))

    def last_turn(self, entity_id: str) -> Turn | None:
        turns = self._entity_turns.get(entity_id)
        return turns[-1] if turns else None

    @property
    def identity(self) -> Mapping[str, Any] | None:
        """The root context: the identity of the first top-level entity (IDENTITY-4)."""
        for record in self._entities.values():
            if record.parent_entity_id is None:
                return record.identity
        return None

    def thread(self, leaf_id: str) -> list[Turn]:
        """The root-to-leaf path ending at ``leaf_id`` (LOOM-10)."""
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
        path: list[Turn] = []
        current = self.get(leaf_id)
        while True:
            path.append(current)
            parent_id = current.parent_id
            if parent_id is None:
                break
            parent = self.get(parent_id)
            if parent.entity_id != current.entity_id:
                record = self._entities.get(current.entity_id)
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
        if where in self._entities:
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
        return [t for t in self._turns if not self._children.get(t.id)]

    def threads(self) -> list[list[Turn]]:
        """Every root-to-leaf path, ordered by when its leaf was recorded."""
        return [self.thread(leaf.id) for leaf in self.leaves()]

    # -- index ---------------------------------------------------------------

    def _index_entity(self, record: EntityRecord) -> None:
        self._entities[record.entity_id] = record
        self._entity_turns.setdefault(record.entity_id, [])

    def _index_turn(self, turn: Turn) -> None:
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
