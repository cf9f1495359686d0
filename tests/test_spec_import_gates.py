"""Your own Python gate named in a spec file (issue 47.1): ``{ import =
"package.module:function" }`` with the other keys a gate entry takes, resolved from the
spec's folder and the environment, checked at load, usable by every front end and by
the workers (a queued spec carries the reference, never code)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cantrip._errors import ConstructionError
from cantrip.cli._spec_file import load_cantrip
from cantrip.distributed._spells import build_spell, spell_from_spec
from cantrip.loom import Loom

GATES = '''
from pathlib import Path

import cantrip


@cantrip.gate(dependencies=("root",))
def count_lines(path: str, root: Path) -> int:
    """How many lines the file at ``path`` has."""
    return len((root / path).read_text().splitlines())


def not_a_gate(path: str) -> int:
    return 0
'''


def spec(folder: Path, gates: str, module: str = "team_gates") -> Path:
    """A spec beside its own gate module (a module name no other test writes)."""
    (folder / f"{module}.py").write_text(GATES)
    (folder / "notes.txt").write_text("one\ntwo\nthree\n")
    path = folder / "agent.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [llm]
            provider = "scripted"
            responses = [
                {{ tool_calls = [{{ gate = "lines", args = {{ path = "notes.txt" }} }}] }},
                {{ tool_calls = [{{ gate = "done", args = {{ answer = "counted" }} }}] }},
            ]
            [circle]
            medium = "conversation"
            gates = ["done", {gates}]
            wards = [{{ max_turns = 3 }}]
            """
        )
    )
    return path


@pytest.fixture(autouse=True)
def fresh_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("team_gates", "cli_gates", "worker_gates"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_an_imported_gate_runs_with_its_entry_keys(tmp_path: Path) -> None:
    path = spec(
        tmp_path,
        '{ import = "team_gates:count_lines", name = "lines", '
        'description = "Count lines.", dependencies = { root = "." } }',
    )
    spell = load_cantrip(path)
    gate = next(g for g in spell.circle.gates if g.name == "lines")
    assert gate.description == "Count lines."
    outcome = spell.cast("Count the notes.")
    assert outcome.result == "counted"
    (call,) = outcome.turns[0].gate_calls
    assert (call.gate, call.result) == ("lines", 3)


def test_every_problem_of_imported_gates_is_one_line(tmp_path: Path) -> None:
    path = spec(
        tmp_path,
        '{ import = "team_gates:count_lines", name = "echo" }, "echo", '
        '{ import = "no_such_module:gate" }, { import = "team_gates:missing" }, '
        '{ import = "team_gates:not_a_gate" }, { import = "no-colon" }',
    )
    with pytest.raises(ConstructionError) as caught:
        load_cantrip(path)
    problems = caught.value.problems
    text = "\n".join(problems)
    assert "gate 'no_such_module:gate': No module named 'no_such_module'" in text
    assert "gate 'team_gates:missing': team_gates has no 'missing'" in text
    assert "gate 'team_gates:not_a_gate' is a function, not a gate" in text
    assert "gate 'no-colon' must look like 'package.module:function'" in text
    assert "gate names must be unique; repeated: echo" in text
    assert all("\n" not in p for p in problems)


def test_a_queued_spec_carries_the_reference_and_a_worker_imports_it(tmp_path: Path) -> None:
    path = spec(
        tmp_path,
        '{ import = "worker_gates:count_lines", name = "lines", dependencies = { root = "." } }',
        module="worker_gates",
    )
    spell = spell_from_spec(path)
    queued = json.dumps(spell)
    assert "worker_gates:count_lines" in queued and "def count_lines" not in queued
    # the worker's side: the spell alone, its module found beside the spec
    built = build_spell(json.loads(queued), Loom())
    assert built.cast("Count the notes.").turns[0].gate_calls[0].result == 3


def test_cantrip_cast_runs_an_imported_gate(tmp_path: Path) -> None:
    path = spec(
        tmp_path,
        '{ import = "cli_gates:count_lines", name = "lines", dependencies = { root = "." } }',
        module="cli_gates",
    )
    run = subprocess.run(
        [sys.executable, "-m", "cantrip", "cast", str(path), "Count.", "--json", "-q"],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["result"] == "counted"
