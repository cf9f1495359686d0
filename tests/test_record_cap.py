"""The record cap (issue 28, item 10): what a gate-call record stores of a huge result.

The observation cap keeps a huge result out of the model's context; the record cap
keeps it out of the loom, the gate journal and the exports. A record stores at most
``max_record_chars`` characters (a ward, default 1048576) of its result's text and says
in ``detail["result_cut"]`` how long the whole was and its SHA-256; the medium still
worked with the whole value during the turn.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from mcp_support import call, finish, spell, toolbox

import cantrip
import gates
from cantrip import Cantrip, Circle, Identity, ScriptedLLM, Ward, max_turns
from cantrip._record_cap import RECORD_CAP_CHARS
from cantrip.cli._main import main as cli_main
from cantrip.loom._codec import decode_record
from mediums.python import python

MB30 = 30_000_000


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@cantrip.gate
def rows(n: int) -> dict[str, Any]:
    """A structured result of ``n`` rows."""
    return {"rows": [{"i": i, "text": "r" * 90} for i in range(n)]}


@cantrip.gate
def fail_loudly(n: int) -> str:
    """Fail with an ``n``-character message."""
    raise cantrip.GateError("e" * n)


def tool(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


def stored_records(path: Path) -> list[dict[str, Any]]:
    """Every gate-call record a loom file holds, as stored (big values read back whole)."""
    loom = cantrip.Loom.open(path)
    try:
        return [r.to_dict() for t in loom.turns for r in t.gate_calls]
    finally:
        loom.close()


async def test_a_30mb_mcp_result_is_cut_in_the_jsonl_loom(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loom.jsonl"
    s = spell([call("tb_big", megabytes=30), finish()], toolbox(tmp_path / "m"))
    s = s.with_(loom=cantrip.Loom.open(path))
    outcome = await s.cast_async("big")
    s.loom.close()
    stored = next(r for r in stored_records(path) if r["gate"] == "tb_big")
    cut = stored["detail"]["result_cut"]
    assert cut == {"chars": MB30, "kept": RECORD_CAP_CHARS, "sha256": sha256("z" * MB30)}
    marker = (
        f"\n[cut: {MB30 - RECORD_CAP_CHARS} of {MB30} characters not stored "
        f"(max_record_chars={RECORD_CAP_CHARS}); sha256 {cut['sha256']}]"
    )
    assert stored["result"] == "z" * RECORD_CAP_CHARS + marker
    assert stored["detail"]["via"] == "mcp:tb" and not stored["is_error"]
    assert path.stat().st_size < 2 * RECORD_CAP_CHARS, "the loom holds the cap, not 30 MB"
    # The cast's own records are the stored ones: live and rebuilt results agree.
    live = outcome.turns[0].gate_calls[0]
    assert live.result == stored["result"] and dict(live.detail)["result_cut"] == cut
    assert outcome.turns[0].observation.endswith("(max_observation_chars=65536)]")
    # `cantrip loom FILE show` says so beside the call.
    assert cli_main(["loom", str(path), "show", outcome.entity_id]) == 0
    shown = capsys.readouterr().out
    assert f"(via mcp:tb)  (stored {RECORD_CAP_CHARS} of {MB30} characters)" in shown


async def test_every_gate_is_capped_by_the_ward_structured_and_error_results_too() -> None:
    llm = ScriptedLLM([tool("rows", n=100), tool("fail_loudly", n=5000), tool("done", answer="ok")])
    circle = Circle([gates.done, rows, fail_loudly], [max_turns(4), Ward("max_record_chars", 1000)])
    outcome = await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("go")
    structured, failed = (t.gate_calls[0] for t in outcome.turns[:2])
    whole = json.dumps(rows.fn(100), separators=(",", ":"))
    assert dict(structured.detail)["result_cut"] == {
        "chars": len(whole),
        "kept": 1000,
        "sha256": sha256(whole),
        "json": True,
    }
    assert structured.result.startswith(whole[:1000] + "\n[cut: ")
    assert failed.is_error and dict(failed.detail)["result_cut"]["chars"] == 5000
    assert failed.result.startswith("e" * 1000 + "\n[cut: 4000 of 5000 characters")
    done_record = outcome.turns[2].gate_calls[0]
    assert "result_cut" not in done_record.detail, "what fits is stored as it is"


async def test_code_works_with_the_whole_result_and_only_the_record_is_cut() -> None:
    llm = ScriptedLLM(
        [{"code": "r = rows(n=50)\nn = len(r['rows'])\ndone(n)"}],
    )
    circle = Circle([gates.done, rows], [max_turns(2), Ward("max_record_chars", 500)], python)
    outcome = await Cantrip(llm=llm, identity=Identity(), circle=circle).cast_async("count")
    assert outcome.result == 50
    record = outcome.turns[0].gate_calls[0]
    assert dict(record.detail)["result_cut"]["kept"] == 500


async def test_a_replay_from_a_cut_record_says_so() -> None:
    llm = ScriptedLLM([{"code": "r = rows(n=50)\nprint(len(r['rows']))"}])
    circle = Circle([gates.done, rows], [max_turns(1), Ward("max_record_chars", 500)], python)
    s = Cantrip(llm=llm, identity=Identity(), circle=circle)
    outcome = await s.cast_async("count")
    forked = s.fork(outcome.turns[0], llm=ScriptedLLM([{"code": "done(1)"}]))
    async with forked:
        await forked.send("go on")
    report = forked.restore_report
    assert report is not None and report.hydrated == 1
    assert report.divergences == [
        f"replay: the loom keeps 500 of the {len(json.dumps(rows.fn(50), separators=(',', ':')))} "
        "characters rows returned (max_record_chars); the code sees that part, as text"
    ]


async def test_the_gate_journal_stores_the_cap_too(tmp_path: Path) -> None:
    loom = cantrip.Loom.open(tmp_path / "loom.db", journal=True)
    llm = ScriptedLLM([tool("rows", n=100), tool("done", answer="ok")])
    circle = Circle([gates.done, rows], [max_turns(3), Ward("max_record_chars", 1000)])
    s = Cantrip(llm=llm, identity=Identity(), circle=circle, loom=loom)
    outcome = await s.cast_async("go")
    entries = await loom.journal_read(outcome.entity_id, 1)
    recorded = [decode_record(e[3]) for e in entries if e[1] == "rows" and e[3] is not None]
    assert recorded, "the journal kept the completed call"
    assert recorded[0]["detail"]["result_cut"]["kept"] == 1000
    assert len(recorded[0]["result"]) < 1200
    loom.close()
