"""Big values stored once: a loom that records the same large result many times grows
by about one copy, and every reader still gets the whole value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
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
    loom = Loom.open(path)  # it reads back, redacted (its key is of what is stored)
    got = [c.result for t in loom.turns for c in t.gate_calls if c.gate == "read_big"]
    loom.close()
    assert len(got) == 2 and all(g.startswith(BIG) and secret not in g for g in got)


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


# -- issue 39 item 4: a stored value keeps its kind, and a damaged blob is never served --

STRUCTURED = {"rows": [{"n": i, "text": "0123456789abcdef" * 8} for i in range(200)]}
STRUCTURED_TEXT = orjson.dumps(STRUCTURED).decode()  # the dict's JSON: the same characters


def two_kinds(loom: Loom, order: tuple[str, ...]) -> Cantrip:
    """Gate ``as_dict`` returns STRUCTURED, ``as_text`` the string of its JSON."""

    @cantrip.gate(name="as_dict")
    def as_dict() -> dict[str, object]:
        return STRUCTURED

    @cantrip.gate(name="as_text")
    def as_text() -> str:
        return STRUCTURED_TEXT

    script: list[dict[str, object]] = [
        {"tool_calls": [{"gate": name, "args": {}}]} for name in order
    ]
    script.append({"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]})
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="Reader."),
        circle=Circle([done, as_dict, as_text], [max_turns(len(order) + 2)]),
        loom=loom,
    )


def results(loom: Loom) -> dict[str, object]:
    """Each gate's result as read back from the loom."""
    return {
        call.gate: call.result
        for turn in loom.turns
        for call in turn.gate_calls
        if call.gate in ("as_dict", "as_text")
    }


@pytest.mark.parametrize("order", [("as_dict", "as_text"), ("as_text", "as_dict")])
@pytest.mark.parametrize("suffix", [".db", ".jsonl"])
async def test_a_string_that_is_a_dicts_json_reads_back_as_that_string(
    tmp_path: Path, suffix: str, order: tuple[str, ...]
) -> None:
    assert len(STRUCTURED_TEXT) >= THRESHOLD
    path = tmp_path / f"loom{suffix}"
    loom = Loom.open(path)
    await two_kinds(loom, order).cast_async("read both")
    loom.close()
    loom = Loom.open(path)
    assert results(loom) == {"as_dict": STRUCTURED, "as_text": STRUCTURED_TEXT}
    assert isinstance(results(loom)["as_text"], str)
    loom.close()


async def test_postgres_keeps_the_kind_of_a_stored_value(pg_url: str) -> None:
    loom = Loom.open(pg_url)
    result = await two_kinds(loom, ("as_dict", "as_text")).cast_async("read both")
    loom.close()
    loom = Loom.open(pg_url)
    turns = loom.entity_turns(result.entity_id)
    got = {c.gate: c.result for t in turns for c in t.gate_calls if c.gate != "done"}
    assert got == {"as_dict": STRUCTURED, "as_text": STRUCTURED_TEXT}
    loom.close()


def tamper(path: Path) -> None:
    """Replace the stored text of the loom's one blob with other text (a disk that flipped
    bits, an edit): the blob's key no longer matches what it holds."""
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            record = orjson.loads(line)
            if record["type"] == "blob" and isinstance(record["data"], str):
                record["data"] = record["data"].replace("0123", "9999", 1)
                lines[i] = orjson.dumps(record).decode()
        path.write_text("\n".join(lines) + "\n")
        return
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("UPDATE blobs SET data = replace(data, '0123', '9999')")
    db.commit()
    db.close()


@pytest.mark.parametrize("suffix", [".db", ".jsonl"])
async def test_a_blob_that_no_longer_hashes_to_its_key_is_an_error(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"loom{suffix}"
    loom = Loom.open(path)
    await reader(loom, 1).cast_async("read it")
    loom.close()
    tamper(path)
    shown = subprocess.run(
        [sys.executable, "-m", "cantrip", "loom", str(path), "export"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 1 and "9999" not in shown.stdout
    assert str(path) in shown.stderr and "check" in shown.stderr and "recover" in shown.stderr
    assert "does not match" in shown.stderr, shown.stderr
    checked = subprocess.run(
        [sys.executable, "-m", "cantrip", "loom", str(path), "check", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 1
    report = orjson.loads(checked.stdout)
    assert report["intact"] is False and report["damaged_blobs"] >= 1


def old_loom(path: Path, refs: list[tuple[dict[str, object], object]]) -> None:
    """A JSONL loom as cantrip wrote it before issue 39: one turn whose gate results are
    references keyed by the SHA-256 of the text alone (``refs``: the reference and what
    its blob holds)."""
    import hashlib

    loom = Loom.open(path)
    trio_run(reader(loom, len(refs), "small").cast_async, "old")
    loom.close()
    lines = [orjson.loads(line) for line in path.read_text().splitlines()]
    out: list[dict[str, object]] = []
    index = 0
    for record in lines:
        if record["type"] == "turn" and index < len(refs) and record.get("gate_calls"):
            ref, held = refs[index]
            index += 1
            text = held if isinstance(held, str) else orjson.dumps(held).decode()
            digest = hashlib.sha256(text.encode()).hexdigest()
            out.append({"type": "blob", "hash": digest, "data": held})
            record["gate_calls"][0]["result"] = {"$blob": digest, "size": len(text), **ref}
        out.append(record)
    path.write_text("".join(orjson.dumps(r).decode() + "\n" for r in out))


def trio_run(fn: object, *args: object) -> object:
    import trio

    return trio.run(fn, *args)  # type: ignore[arg-type]


def test_references_written_before_the_kind_was_in_the_key_still_read(tmp_path: Path) -> None:
    """Old refs keep working: ``{"$blob", "size"}`` is text, ``"json": true`` structured,
    both keyed by the text alone -- including an old loom where a string and a dict of
    the same text shared one blob (whichever was stored first is read as the kind its
    reference names)."""
    path = tmp_path / "old.jsonl"
    old_loom(
        path,
        [
            ({}, STRUCTURED),  # a string ref whose shared blob holds the dict
            ({"json": True}, STRUCTURED_TEXT),  # a dict ref whose shared blob holds the text
            ({}, BIG),
        ],
    )
    loom = Loom.open(path)
    got = [c.result for t in loom.turns for c in t.gate_calls if c.gate == "read_big"]
    loom.close()
    assert got == [STRUCTURED_TEXT, STRUCTURED, BIG]
    checked = subprocess.run(
        [sys.executable, "-m", "cantrip", "loom", str(path), "check", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert orjson.loads(checked.stdout)["intact"] is True, checked.stdout


async def test_a_db_session_tails_its_turns_with_their_big_values(pg_url: str) -> None:
    """``serve --db`` tells a session's turns to its followers from the loom
    (``DbSessions.turns_after``): a big value stored apart is told whole, as every other
    reader gets it -- before, its followers got the reference that stands in its place."""
    from cantrip.loom._postgres import PostgresStore
    from cantrip.protocols.sessions._rows import DbSessions

    loom = Loom.open(pg_url)
    result = await reader(loom, 2).cast_async("pg tail")
    loom.close()
    store = PostgresStore(pg_url, max_connections=2)
    try:
        told = DbSessions(store).turns_after(result.entity_id, 0)
    finally:
        store.close()
    calls = [c for _, turn in told for c in turn.gate_calls if c.gate == "read_big"]
    assert len(calls) == 2 and all(c.result == BIG for c in calls)
