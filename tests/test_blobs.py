"""Big values stored once: a loom that records the same large result many times grows
by about one copy, and every reader still gets the whole value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import cantrip
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip.loom import export_jsonl
from cantrip.loom._blobs import THRESHOLD
from cantrip.loom._retention import prune
from gates import done

BIG = "0123456789abcdef" * (1024 * 1024 // 16)  # 1 MiB


def reader(loom: Loom, times: int, value: str = BIG) -> Cantrip:
    @cantrip.gate(name="read_big")
    def read_big() -> str:
        return value

    script = [{"tool_calls": [{"gate": "read_big", "args": {}}]} for _ in range(times)]
    script.append({"tool_calls": [{"gate": "done", "args": {"answer": "read it"}}]})
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="Reader."),
        circle=Circle([done, read_big], [max_turns(times + 2)]),
        loom=loom,
    )


@pytest.mark.parametrize("suffix", [".db", ".jsonl"])
async def test_the_same_big_result_100_times_is_stored_about_once(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"loom{suffix}"
    loom = Loom.open(path)
    result = await reader(loom, 100).cast_async("Read the big file again and again.")
    loom.close()
    assert result.terminated
    size = path.stat().st_size + sum(
        p.stat().st_size for p in tmp_path.glob(f"loom{suffix}-*")
    )  # SQLite's WAL
    assert size < 3 * len(BIG), f"{size / 1e6:.1f} MB for 100 copies of 1 MiB"
    again = Loom.open(path)
    turns = again.entity_turns(result.entity_id)
    assert all(t.gate_calls[0].result == BIG for t in turns[:100])
    exported = export_jsonl(again)
    assert exported.count(BIG[:64]) >= 100  # exports inline every value
    again.close()


async def test_values_under_the_threshold_stay_inline_and_structured_ones_dedupe(
    tmp_path: Path,
) -> None:
    path = tmp_path / "loom.db"
    small = "x" * (THRESHOLD - 1)
    loom = Loom.open(path)
    await reader(loom, 3, small).cast_async("small")
    loom.close()
    import sqlite3

    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM blobs").fetchone() == (0,)
    db.close()


async def test_a_secret_inside_a_big_value_is_not_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-test-" + "S3CR3T" * 6
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    await reader(loom, 2, BIG + secret).cast_async("leak?")
    loom.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert secret.encode() not in raw


async def test_prune_collects_blobs_no_one_refers_to(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    gone = await reader(loom, 2, BIG).cast_async("old")
    kept = await reader(loom, 2, BIG[::-1]).cast_async("new")
    loom.close()
    prune(Loom.open(path), entity=gone.entity_id, busy_s=0)
    db = sqlite3.connect(path)
    (left,) = db.execute("SELECT count(*) FROM blobs").fetchone()
    (kept_refs,) = db.execute(
        "SELECT count(*) FROM blob_refs WHERE entity_id = ?", (kept.entity_id,)
    ).fetchone()
    assert left == kept_refs > 0  # the pruned cast's blobs went with it
    assert db.execute(
        "SELECT count(*) FROM blob_refs WHERE entity_id = ?", (gone.entity_id,)
    ).fetchone() == (0,)
    db.close()
    again = Loom.open(path)
    assert again.entity_turns(kept.entity_id)[0].gate_calls[0].result == BIG[::-1]
    again.close()
    assert path.stat().st_size < 2 * len(BIG)


async def test_a_recovered_loom_keeps_its_big_values(tmp_path: Path) -> None:
    path = tmp_path / "loom.db"
    loom = Loom.open(path)
    await reader(loom, 2).cast_async("recover me")
    loom.close()
    out = subprocess.run(
        [sys.executable, "-m", "cantrip", "loom", str(path), "recover", str(tmp_path / "new.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    copy = Loom.open(tmp_path / "new.db")
    (entity,) = copy.entities
    assert copy.entity_turns(entity)[0].gate_calls[0].result == BIG
    copy.close()


async def test_postgres_stores_big_values_once(pg_url: str) -> None:
    import psycopg

    loom = Loom.open(pg_url)
    result = await reader(loom, 50).cast_async("pg")
    assert [t.gate_calls[0].result == BIG for t in loom.entity_turns(result.entity_id)][:50] == [
        True
    ] * 50
    loom.close()
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size('cantrip_turns'), "
            "pg_total_relation_size('cantrip_blobs'), (SELECT count(*) FROM cantrip_blobs)"
        ).fetchone()
    assert row is not None
    turns_bytes, blob_bytes, blobs = row
    assert blobs <= 3 and turns_bytes < len(BIG) and blob_bytes < 3 * len(BIG)
