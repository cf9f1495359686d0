"""What `cantrip serve` does per prompt stays O(what is new) (issue 24's load bar).

Timing belongs in bench/serve_load.py; these tests pin the behaviour an
optimisation must keep, and that the history is not re-read per prompt.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

import cantrip
from cantrip.protocols._sessions import SessionHub
from gates import done


def spell(path: Path, script: list[Any]) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(system_prompt="cost"),
        circle=cantrip.Circle([done], [cantrip.max_turns(3)]),
        loom=cantrip.Loom.open(path),
    )


def answer(text: str) -> Any:
    return {"tool_calls": [{"gate": "done", "args": {"answer": text}}]}


async def test_an_unkeyed_prompt_does_not_read_the_entitys_recorded_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading an entity's turns from a loom store is O(its history): a prompt
    without an Idempotency-Key never does; a keyed one still finds its cast."""
    hub = SessionHub(spell(tmp_path / "cost.db", [answer(f"a{i}") for i in range(6)]))
    session, _ = hub.create()
    loom = hub.spell.loom
    reads: list[str] = []
    real = type(loom).entity_turns

    def counted(self: Any, entity_id: str) -> Any:
        reads.append(entity_id)
        return real(self, entity_id)

    monkeypatch.setattr(type(loom), "entity_turns", counted)
    for i in range(3):
        outcome = await hub.prompt(session, f"task {i}")
        assert outcome is not None and outcome.result == f"a{i}"
    assert reads == []
    keyed = await hub.prompt(session, "keyed", key="k-1")
    assert keyed is not None and keyed.result == "a3" and reads  # the key index reads them
    await hub.prompt(session, "plain again")
    again = await hub.prompt(session, "keyed", key="k-1")  # a retry: no new cast
    assert again is not None and again.result == "a3"
    assert [t.intent for t in loom.entity_turns(session.entity.id) if t.intent] == [
        "task 0",
        "task 1",
        "task 2",
        "keyed",
        "plain again",
    ]
    await hub.aclose()
    loom.close()


def test_serve_collects_garbage_in_larger_batches_and_restores_the_setting() -> None:
    from cantrip._cli import _serve_gc

    before = gc.get_threshold()
    with _serve_gc(None):  # the default of `cantrip serve`
        assert gc.get_threshold() == (50_000, *before[1:])
    assert gc.get_threshold() == before
    with _serve_gc(1234):
        assert gc.get_threshold()[0] == 1234
    with _serve_gc(0):  # --gc-young 0: Python's own thresholds
        assert gc.get_threshold() == before
    assert gc.get_threshold() == before


def test_a_negative_gc_threshold_is_one_line_and_serves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cantrip import _cli

    before = gc.get_threshold()
    code = _cli.main(["serve", str(tmp_path / "none.toml"), "--gc-young", "-1"])
    err = capsys.readouterr().err
    assert code == 1 and gc.get_threshold() == before
    assert err.strip().splitlines() == [
        "cantrip: --gc-young -1: give 0 (Python's own) or a positive threshold"
    ]
