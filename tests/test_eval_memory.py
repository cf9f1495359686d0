"""A cross-session eval (issue 42): cases whose agent is told facts in earlier sessions
(``before``) and must recall them in a later one, run with memory on and off.

The shipped example (``cantrip init memory``) replays offline from its recording; its
pass rates are read from the run's own report, never written down here. The recording is
a small model's that answers only from its context (tests/memory_reader.py), so with
memory off the cases fail because the answer is not there, not because of a divergence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from memory_reader import RECORDING, SPECS, SUITE, MemoryReader, record

from cantrip._errors import ConstructionError
from cantrip.evals import Case, Expect, Suite, load_suite, run_suite
from cantrip.evals._suite import parse_suite
from cantrip.loom import Loom
from cantrip.spec import build_cantrip, load_spec_file

CANTRIP = str(Path(sys.executable).with_name("cantrip"))


def _cantrip(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.run(
        [CANTRIP, *argv], cwd=cwd, capture_output=True, text=True, timeout=180, env=env
    )


def _report(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def test_the_memory_example_replays_offline_and_memory_on_beats_memory_off(
    tmp_path: Path,
) -> None:
    made = _cantrip("init", "memory", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    on = _cantrip("eval", "evals/memory.yaml", "--replay", "--json", "on.json", cwd=tmp_path)
    off = _cantrip(
        "eval", "evals/memory.yaml", "--replay", "--spec", "memory_off.toml",
        "--json", "off.json", cwd=tmp_path,
    )  # fmt: skip
    on_report, off_report = _report(tmp_path / "on.json"), _report(tmp_path / "off.json")
    on_rate = on_report["summary"]["pass_rate"]
    off_rate = off_report["summary"]["pass_rate"]
    assert on_rate > off_rate, (on.stdout, off.stdout)
    assert on.returncode == (0 if on_rate == 1 else 1) and off.returncode == 1
    assert on_report["mode"] == off_report["mode"] == "replay"
    # memory off fails honestly: the agent answered, it just did not know
    failed = [r for c in off_report["cases"] for r in c["results"] if r["status"] == "failed"]
    assert failed
    for run in failed:
        assert run["error"] is None and run["reason"] == "done", run
        assert "don't know" in run["result"]
    print(f"memory on: pass rate {on_rate:.2f}; memory off: {off_rate:.2f}")


def test_the_recording_is_the_honest_models_and_records_again(tmp_path: Path) -> None:
    """Recording the suite again with the model that reads only its context gives the
    same pass rates as replaying the shipped recording, case by case."""
    fresh = tmp_path / "again.jsonl"
    rates = trio.run(record, fresh)
    assert rates["on"] > rates["off"]
    suite = load_suite(SUITE)

    async def replayed(recording: Path) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for mode, spec in SPECS.items():
            report = await run_suite(suite, spec=spec, replay=recording)
            out[mode] = {r.case: r.status for r in report.runs}
        return out

    shipped, again = trio.run(replayed, RECORDING), trio.run(replayed, fresh)
    assert shipped == again
    rate_on = sum(s == "passed" for s in shipped["on"].values()) / len(shipped["on"])
    assert rate_on == rates["on"]


def _spell(tmp_path: Path, mode: str = "on") -> Any:
    doc = load_spec_file(SPECS[mode])

    def build(loom: Loom) -> Any:
        return build_cantrip(
            doc, base_dir=SPECS[mode].parent, loom=loom, llm=MemoryReader(), memory_given=True
        )

    return build


def test_earlier_sessions_are_new_entities_of_the_cases_user(tmp_path: Path) -> None:
    suite = Suite(
        [
            Case(
                name="told-then-asked",
                user="erin",
                before=["Remember: my boat is the Heron.", "Remember: my cat is Miso."],
                intent="What is my boat?",
                expect=Expect(result_contains="Heron"),
            )
        ]
    )
    loom = Loom.open(tmp_path / "runs.db")
    try:
        report = trio.run(lambda: run_suite(suite, cantrip=_spell(tmp_path), loom=loom))
        [run] = report.runs
        assert run.status == "passed", run.why
        firsts = [t for t in loom.turns if t.parent_id is None]
        assert [t.intent for t in firsts] == [*suite.cases[0].before, "What is my boat?"]
        assert len({t.entity_id for t in firsts}) == 3  # a session each
        assert all(t.extras["eval"]["case"] == "told-then-asked" for t in firsts)
        assert all(t.extras["user"] == "erin" for t in firsts)  # the case's user, each time
        assert run.entity_id == firsts[-1].entity_id  # the checks judge the last cast
        # the last cast's context held what the earlier sessions remembered
        recalled = firsts[-1].extras["memory"]
        assert recalled["namespace"] == ["user", "erin"]
        assert {r["key"] for r in recalled["recalled"]} >= {"boat"}
    finally:
        loom.close()


def test_every_run_of_a_case_starts_with_an_empty_memory(tmp_path: Path) -> None:
    """Two repeats into one loom: the second's first session recalls nothing the first
    run stored (a run of its own memory), so both see the prompts a replay expects."""
    suite = Suite(
        [
            Case(
                name="asked-first",
                user="fay",
                before=["Remember: my song is Blackbird."],
                intent="What is my song?",
                expect=Expect(result_contains="Blackbird"),
            ),
            Case(
                name="never-told",
                user="fay",
                intent="What is my song?",
                expect=Expect(result_contains="don't know"),
            ),
        ]
    )
    loom = Loom.open(tmp_path / "runs.db")
    try:
        report = trio.run(
            lambda: run_suite(suite, cantrip=_spell(tmp_path), loom=loom, repeat=2, concurrency=1)
        )
        assert [r.status for r in report.runs] == ["passed"] * 4, [r.why for r in report.runs]
        tellings = [t for t in loom.turns if t.intent == "Remember: my song is Blackbird."]
        assert len(tellings) == 2 and all("memory" not in t.extras for t in tellings)
    finally:
        loom.close()
    assert not list(tmp_path.glob("cantrip-eval-memory-*"))


def test_an_earlier_session_that_fails_names_itself(tmp_path: Path) -> None:
    suite = Suite(
        [
            Case(
                name="unrecorded",
                user="gus",
                before=["Remember: my hat is red.", "Remember: my scarf is not recorded."],
                intent="What is my hat?",
            )
        ]
    )
    recording = tmp_path / "partial.jsonl"
    partial = Suite([Case(name="one", user="gus", intent="Remember: my hat is red.")])
    trio.run(lambda: run_suite(partial, cantrip=_spell(tmp_path), record=recording))
    report = trio.run(lambda: run_suite(suite, spec=SPECS["on"], replay=recording))
    [run] = report.runs
    assert run.status == "failed"
    assert run.error is not None and run.error.startswith("earlier session 2 of 2: replay diverged")


@pytest.mark.parametrize(
    ("before", "problem"),
    [
        (["  "], "before: an earlier session's intent may not be empty"),
        ("Remember this.", "before: Input should be a valid list"),
        (["x"] * 51, "before: List should have at most 50 items"),
    ],
)
def test_a_bad_before_is_refused_naming_the_case(before: Any, problem: str) -> None:
    doc = {"cases": [{"name": "c", "intent": "Ask.", "before": before}]}
    with pytest.raises(ConstructionError) as refused:
        parse_suite(doc, source="s.yaml")
    assert any(p.startswith("s.yaml: case 'c': ") and problem in p for p in refused.value.problems)
