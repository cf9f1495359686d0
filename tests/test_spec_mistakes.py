"""Spec mistakes as a user reads them (issue 30, item 8): all at once, with a close
match where there is one, without spec rule ids unless ``--debug``."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from cantrip.cli import _main as _cli

MISTAKES = """
[llm]
provider = "scripted"
respones = [{ content = "hi" }]

[identity]
system_promt = "Be brief."

[circle]
medium = "conversation"
gates = ["done", "ecko", "raed"]
wards = [{ max_turn = 5 }]

[loom]
path = "loom.db"
"""


def run(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    monkeypatch.delenv("CANTRIP_DEBUG", raising=False)
    code = _cli.main(argv)
    return code, capsys.readouterr().err


def test_every_problem_of_a_spec_comes_in_one_run_with_a_close_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(MISTAKES)
    code, err = run(["cast", str(spec), "hi"], monkeypatch, capsys)
    assert code == 1
    lines = err.strip().splitlines()
    assert lines == [
        "cantrip: 6 problems (all of them, so you can fix them in one pass):",
        f"  - {spec}: unknown key 'llm.respones' -- did you mean 'responses'?",
        f"  - {spec}: unknown key 'identity.system_promt' -- did you mean 'system_prompt'?",
        f"  - {spec}: unknown gate 'ecko' -- did you mean 'echo'?",
        f"  - {spec}: unknown gate 'raed' -- did you mean 'read'?",
        f"  - {spec}: unknown ward 'max_turn' -- did you mean 'max_turns'?",
        # what the misspelt ward leaves behind, in plain words (no rule ids)
        f"  - {spec}: cantrip must have at least one truncation ward, e.g. max_turns",
    ]
    assert not (tmp_path / "loom.db").exists(), "a spec that does not load opens no loom"


def test_rule_ids_are_for_debug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\n[circle]\nmedium = "conversation"\ngates = ["echo"]\n'
    )
    code, err = run(["cast", str(spec), "hi"], monkeypatch, capsys)
    assert code == 1
    assert "circle must have a done gate" in err and "CIRCLE-1" not in err
    assert "LOOP-2" not in err and "CIRCLE-2" not in err
    code, err = run(["cast", str(spec), "hi", "--debug"], monkeypatch, capsys)
    assert code == 1 and "(CIRCLE-1)" in err


def test_no_close_match_lists_what_there_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\n[circle]\nmedium = "conversation"\n'
        'gates = ["done", "zzzz"]\nwards = [{ max_turns = 2 }, { qqqq = 1 }]\n'
    )
    code, err = run(["cast", str(spec), "hi"], monkeypatch, capsys)
    assert code == 1
    assert "unknown gate 'zzzz' (built-in gates: ask_user," in err and "did you mean" not in err
    assert "unknown ward 'qqqq' (known wards: budget_notice, max_batch_size," in err


def test_an_empty_intent_says_how_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[llm]\nprovider = "scripted"\nresponses = [{ content = "hi" }]\n[circle]\n'
        'medium = "conversation"\ngates = ["done"]\nwards = [{ max_turns = 2 }]\n'
    )
    for argv in (["cast", str(spec), "  "], ["cast", str(spec)]):
        code, err = run(argv, monkeypatch, capsys)
        assert code == 1
        assert err.strip() == (
            "cantrip: the intent is empty: give it after the spec file (cantrip cast SPEC "
            '"what to do") or on stdin (echo "what to do" | cantrip cast SPEC)'
        )
        assert "INTENT-1" not in err
