"""A cut-off turn's cost, as recorded and as every display shows it (issue 47.7).

A turn cut while its model call was in flight (a timeout, a cancel) recorded no usage,
so ``loom list`` said ``$0`` while the viewer said "cost unknown". The call may have run
and been billed before the cut: the turn now records its usage as missing, and the
progress line, ``cast --json``, ``loom list`` and the viewer all read "unknown" from the
one rule (:func:`cantrip.loom._summary.turn_cost`). A turn cut after its answer arrived
keeps that answer's usage.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import trio
from rich.console import Console

import cantrip
from cantrip._outcome import result_dict
from cantrip.cli._loom import main as loom_main
from cantrip.loom._summary import turn_cost
from cantrip.protocols.terminal._progress import Progress
from cantrip.protocols.viewer._api import LoomViews
from gates import done


@cantrip.gate
async def wait() -> str:
    """Wait until the cast is cut off."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _spell(entry: dict[str, object], path: Path) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([entry]),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done, wait], [cantrip.max_turns(3), cantrip.timeout(0.5)]),
        loom=cantrip.Loom.open(path),
    )


async def test_a_turn_cut_while_its_model_call_is_in_flight_costs_unknown_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cut.db"
    spell = _spell(
        {"tool_calls": [{"gate": "done", "args": {"answer": "late"}}], "delay_ms": 60_000},
        path,
    )
    progress = Progress(Console(file=io.StringIO(), force_terminal=True, width=120))
    with progress:
        outcome = await spell.cast_async("go", on_event=progress)
    spell.loom.close()
    assert (outcome.truncated, outcome.reason) == (True, "timeout")
    [turn] = outcome.turns
    assert turn.metadata.usage_missing  # the call ran: what it cost nobody knows
    assert turn_cost(turn) is None
    # the progress line and cast --json
    assert " · cost unknown · " in progress.status()
    assert outcome.cost_usd is None and result_dict(outcome)["cost_usd"] is None
    # loom list, text and JSON
    assert loom_main([str(path), "list"]) == 0
    listed = capsys.readouterr().out
    assert "cost unknown" in listed and "$0" not in listed
    assert loom_main([str(path), "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threads"][0]["cost_usd"] is None
    assert data["entities"][0]["cost_usd"] is None
    # the viewer
    loom = cantrip.Loom.open(path)
    try:
        assert LoomViews(lambda: loom).turn(turn.id)["cost"] is None
    finally:
        loom.close()


async def test_a_turn_cut_after_its_answer_arrived_keeps_the_answers_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model answered (and was paid for); the cut came while a gate ran."""
    path = tmp_path / "cut.db"
    spell = _spell(
        {
            "tool_calls": [{"gate": "wait", "args": {}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30},
        },
        path,
    )
    outcome = await spell.cast_async("go")
    spell.loom.close()
    assert (outcome.truncated, outcome.reason) == (True, "timeout")
    [turn] = outcome.turns
    meta = turn.metadata
    assert (meta.tokens_prompt, meta.tokens_completion, meta.usage_missing) == (120, 30, False)
    assert [c.status for c in turn.gate_calls] == ["cancelled"]
    assert outcome.usage.prompt_tokens == 120
    assert loom_main([str(path), "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threads"][0]["tokens"]["prompt"] == 120


async def test_a_cut_before_the_model_was_asked_cost_nothing(tmp_path: Path) -> None:
    """A cast cancelled before its first call: nothing was asked, so nothing is unknown."""
    path = tmp_path / "cut.db"
    spell = _spell({"tool_calls": [{"gate": "done", "args": {"answer": "x"}}]}, path)
    with trio.CancelScope() as scope:
        scope.cancel()
        await spell.cast_async("go")
    loom = spell.loom
    [entity] = loom.entities.values()
    turns = loom.entity_turns(entity.entity_id)
    loom.close()
    assert [t.truncated for t in turns] == [True]
    assert not turns[0].metadata.usage_missing
    assert turn_cost(turns[0]) == 0.0
