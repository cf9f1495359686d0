"""Pruning a 100k-turn loom: its size before and after, and how long prune takes.

Builds an SQLite loom of E root entities x T turns (default 10,000 x 10 = 100,000
turns, each with a gate call and a few hundred bytes of text), their last activity
spread over 100 days, then prunes the older half (``--before`` the median day) with an
archive, and prints the figures. ``--pg URL`` runs the same against PostgreSQL.

    python bench/prune.py [--entities E] [--turns T]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cantrip.loom import GateCallRecord, Turn, TurnMetadata
from cantrip.loom._codec import encode_record
from cantrip.loom._loom import Loom
from cantrip.loom._model import EntityRecord
from cantrip.loom._retention import prune, stats

START = datetime(2026, 1, 1, tzinfo=UTC)


def build(path: Path, entities: int, turns: int) -> None:
    loom = Loom.open(path)
    db = loom.store._db  # type: ignore[attr-defined]
    db.execute("BEGIN")
    for e in range(entities):
        entity_id = f"entity-{e:08d}"
        when = START + timedelta(days=100 * e / entities)
        record = EntityRecord(
            entity_id, "bench", {"system_prompt": "Bench."}, created_at=when.isoformat()
        )
        db.execute(
            "INSERT INTO entities (entity_id, data) VALUES (?, ?)",
            (entity_id, encode_record(record.to_dict())),
        )
        parent = None
        for seq in range(1, turns + 1):
            turn = Turn(
                id=f"{entity_id}-t{seq}",
                parent_id=parent,
                entity_id=entity_id,
                sequence=seq,
                intent="Summarise the report." if seq == 1 else None,
                content="Working on it. " * 10,
                observation="result " * 40,
                gate_calls=(GateCallRecord("echo", {"text": "x" * 50}, "x" * 50),),
                metadata=TurnMetadata(
                    12, 34, timestamp=(when + timedelta(seconds=seq)).isoformat()
                ),
                terminated=seq == turns,
                reason="done" if seq == turns else None,
            )
            db.execute(
                "INSERT INTO turns (id, parent_id, entity_id, sequence, data) VALUES (?,?,?,?,?)",
                (turn.id, parent, entity_id, seq, encode_record(turn.to_dict())),
            )
            parent = turn.id
    db.execute("COMMIT")
    loom.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.db"
        started = time.perf_counter()
        build(path, args.entities, args.turns)
        print(
            f"built {args.entities} entities x {args.turns} turns in "
            f"{time.perf_counter() - started:.1f} s"
        )
        loom = Loom.open(path)
        before = stats(loom)
        print(
            f"before: {before['turns']} turns, file {path.stat().st_size / 1e6:.1f} MB, "
            f"tables {before['bytes'] / 1e6:.1f} MB"
        )
        cut = START + timedelta(days=50)
        done = prune(loom, before=cut, archive=str(Path(tmp) / "archive.jsonl"), busy_s=0)
        after = stats(loom)
        loom.close()
        print(
            f"pruned {len(done.plan.roots)} entities, {done.plan.turns} turns "
            f"(archived to JSONL, {(Path(tmp) / 'archive.jsonl').stat().st_size / 1e6:.1f} MB) "
            f"in {done.seconds:.2f} s"
        )
        print(
            f"after: {after['turns']} turns, file {path.stat().st_size / 1e6:.1f} MB, "
            f"tables {after['bytes'] / 1e6:.1f} MB"
        )
        loom = Loom.open(path)
        started = time.perf_counter()
        done = prune(loom, before=cut, busy_s=0)
        loom.close()
        print(f"a second prune with nothing to remove: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
