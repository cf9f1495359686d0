"""The loop ward (issue 43, item 3): ``max_repeats = N`` ends a cast with reason
``loop`` when the same gate is called with the same arguments N times in a row, or
when N turns in a row are the same utterance with the same observation.

Each test scripts the model, so what trips (and what must not) is exact; the
scripts are long enough that a ward that fails to trip shows as a cast that goes on.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cantrip import Cantrip, Circle, ConstructionError, Identity, Loom, ScriptedLLM, Ward, max_turns
from cantrip._outcome import result_dict
from cantrip.cli import _main as _cli
from cantrip.spec import build_cantrip, load_spec_file
from cantrip.testing import expect
from gates import done, echo


def call(gate: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"gate": gate, "args": args}]}


def spell(responses: list[dict[str, Any]], *wards: Ward, loom: Loom | None = None) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(responses),
        identity=Identity(system_prompt="Be brief."),
        circle=Circle([done, echo], [max_turns(10), *wards]),
        loom=Loom() if loom is None else loom,
    )


FINISH = call("done", answer="finished")


# -- the same call, N times in a row ------------------------------------------------------


async def test_the_same_call_n_times_in_a_row_ends_the_cast_with_reason_loop() -> None:
    loom = Loom()
    script = [call("echo", text="again")] * 6 + [FINISH]
    outcome = await spell(script, Ward("max_repeats", 3), loom=loom).cast_async("Go")
    assert (outcome.terminated, outcome.truncated, outcome.reason) == (False, True, "loop")
    assert len(outcome.turns) == 3  # the third identical call is the last turn
    # the loom records it like any ward's ending: the last turn carries it, and says why
    last = loom.turns[-1]
    assert (last.truncated, last.terminated, last.reason) == (True, False, "loop")
    assert last.extras["loop"] == "echo was called 3 times in a row with the same arguments"
    assert all(t.reason is None for t in loom.turns[:-1])
    assert outcome.summary is not None and outcome.summary.startswith("Truncated by loop")
    # what every front end reports (cast --json, HTTP, the workers' result)
    assert result_dict(outcome)["reason"] == "loop"
    expect(outcome, reason="loop", ended="truncated")  # evals can expect it


async def test_n_minus_one_identical_calls_then_another_do_not_trip() -> None:
    script = [call("echo", text="again")] * 2 + [call("echo", text="else")] * 2 + [FINISH]
    outcome = await spell(script, Ward("max_repeats", 3)).cast_async("Go")
    assert (outcome.terminated, outcome.reason, outcome.result) == (True, "done", "finished")
    assert len(outcome.turns) == 5


async def test_the_same_gate_with_different_arguments_does_not_trip() -> None:
    script = [call("echo", text=f"lap {i}") for i in range(6)] + [FINISH]
    outcome = await spell(script, Ward("max_repeats", 2)).cast_async("Go")
    assert (outcome.terminated, outcome.reason) == (True, "done")
    assert len(outcome.turns) == 7


async def test_arguments_are_compared_by_value_not_by_spelling() -> None:
    # the same arguments in another key order are the same call; true is not 1
    first = {"tool_calls": [{"gate": "echo", "args": {"text": "x", "n": 1}}]}
    again = {"tool_calls": [{"gate": "echo", "args": {"n": 1, "text": "x"}}]}
    looped = await spell([first, again, FINISH], Ward("max_repeats", 2)).cast_async("Go")
    assert looped.reason == "loop"
    other = {"tool_calls": [{"gate": "echo", "args": {"text": "x", "n": True}}]}
    fine = await spell([first, other, FINISH], Ward("max_repeats", 2)).cast_async("Go")
    assert fine.reason == "done"


async def test_identical_calls_inside_one_utterance_count_in_a_row() -> None:
    same = {"tool_calls": [{"gate": "echo", "args": {"text": "x"}}] * 3}
    outcome = await spell([same, FINISH], Ward("max_repeats", 3)).cast_async("Go")
    assert (outcome.reason, len(outcome.turns)) == ("loop", 1)


async def test_without_the_ward_repeating_is_allowed() -> None:
    outcome = await spell([call("echo", text="again")] * 10).cast_async("Go")
    assert outcome.reason == "max_turns"  # off unless configured


# -- N turns that add nothing new -------------------------------------------------------------


async def test_n_turns_with_the_same_utterance_and_observation_trip() -> None:
    # Two calls a turn, the same two each turn: no single call repeats in a row, but
    # the turns themselves add nothing new.
    both = {
        "tool_calls": [
            {"gate": "echo", "args": {"text": "a"}},
            {"gate": "echo", "args": {"text": "b"}},
        ]
    }
    loom = Loom()
    outcome = await spell([both] * 6 + [FINISH], Ward("max_repeats", 3), loom=loom).cast_async("Go")
    assert (outcome.truncated, outcome.reason, len(outcome.turns)) == (True, "loop", 3)
    assert loom.turns[-1].reason == "loop"
    assert loom.turns[-1].extras["loop"] == "3 turns in a row added nothing new to the thread"


async def test_the_same_text_again_and_again_under_require_done_tool_trips() -> None:
    outcome = await spell(
        [{"content": "thinking about it"}] * 6 + [FINISH],
        Ward("max_repeats", 4),
        Ward("require_done_tool", True),
    ).cast_async("Go")
    assert (outcome.reason, len(outcome.turns)) == ("loop", 4)


async def test_turns_whose_observations_change_are_progress() -> None:
    # the same utterance each turn, but the gate answers differently: not a loop of turns
    both = [
        {"tool_calls": [{"gate": "tick", "args": {}}, {"gate": "echo", "args": {"text": "b"}}]}
    ] * 4
    count = iter(range(100))

    from cantrip import gate

    @gate(name="tick")
    def tick() -> int:
        """Count."""
        return next(count)

    spell_ = Cantrip(
        llm=ScriptedLLM([*both, FINISH]),
        identity=Identity(),
        circle=Circle([done, echo, tick], [max_turns(10), Ward("max_repeats", 3)]),
    )
    outcome = await spell_.cast_async("Go")
    assert (outcome.reason, len(outcome.turns)) == ("done", 5)


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 0, 2.5, True, "3"])
def test_max_repeats_must_be_an_integer_of_at_least_two(value: Any) -> None:
    with pytest.raises(ConstructionError, match="max_repeats"):
        Ward("max_repeats", value)


def test_the_smaller_max_repeats_wins_when_wards_compose() -> None:
    circle = Circle([done, echo], [max_turns(5), Ward("max_repeats", 4), Ward("max_repeats", 2)])
    assert circle.resolved.get("max_repeats") == 2


SPEC = """
[llm]
provider = "scripted"
responses = [
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "again" }} }}] }},
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "again" }} }}] }},
  {{ tool_calls = [{{ gate = "echo", args = {{ text = "again" }} }}] }},
  {{ tool_calls = [{{ gate = "done", args = {{ answer = "ok" }} }}] }},
]

[circle]
medium = "conversation"
gates = ["done", "echo"]
wards = [{{ max_turns = 10 }}, {{ max_repeats = {value} }}]
"""


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1", "ward max_repeats takes a whole number of at least 2, not 1"),
        ('"3"', "ward max_repeats takes a whole number of at least 2, not '3'"),
    ],
)
def test_a_spec_with_a_bad_max_repeats_is_refused_in_one_line_with_the_other_problems(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    value: str,
    says: str,
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(value=value).replace('"done", "echo"', '"done", "ecko"'))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    monkeypatch.delenv("CANTRIP_DEBUG", raising=False)
    code = _cli.main(["cast", str(spec), "hi"])
    assert code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert f"  - {says}" in lines
    assert any("unknown gate 'ecko'" in line for line in lines)  # reported together


def test_cast_json_reports_reason_loop_and_exits_as_truncated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(value=3))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code = _cli.main(["cast", str(spec), "Repeat", "--json", "--loom", str(tmp_path / "l.db")])
    outcome = json.loads(capsys.readouterr().out)
    assert code == 2  # truncated by a ward
    assert (outcome["reason"], outcome["truncated"], outcome["turns"]) == ("loop", True, 3)
    loom = Loom.open(tmp_path / "l.db")
    assert loom.turns[-1].reason == "loop"
    loom.close()


def test_a_spec_sets_the_ward(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(value=2))
    built = build_cantrip(load_spec_file(spec), base_dir=tmp_path, loom=Loom())
    assert built.circle.resolved.get("max_repeats") == 2
    assert built.cast("Repeat").reason == "loop"
