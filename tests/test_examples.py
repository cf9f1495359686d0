"""Every grimoire example runs offline and prints what it teaches.

Each script is run as a user would run it, in its own process, with the
provider keys removed and ``CANTRIP_OFFLINE=1`` so the scripted LLM answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRIMOIRE = ROOT / "examples" / "grimoire"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "OPENROUTER_API_KEY")

EXPECTED: dict[str, list[str]] = {
    "01_query.py": [
        "content: 2 + 2 = 4.",
        "'total_tokens': 21",
        "follow-up without context: I don't know",
        "refused: llm returned neither content nor tool_calls (LLM-3)",
    ],
    "02_gate.py": [
        "add(2, 3) = 5.0",
        "refused: invalid arguments for gate 'add'",
        "'bread, milk, apples' (is_error=False)",
        "there is no note called 'todo'\" (is_error=True)",
        "circle refused: gate 'read_note' needs its dependencies bound",
    ],
    "03_circle.py": [
        "refused (no done gate): circle must have a done gate (CIRCLE-1)",
        "refused (no truncating ward):",
        "result: Greeted Ada and Grace. | terminated: True",
        "turn 3: gates [done] -> terminated (done)",
    ],
    "04_cantrip.py": [
        "cast 1: '5'",
        "cast 2: '30'",
        "independent entities: True",
        "identity refused a change: ImmutableError",
        "cantrip refused: cantrip requires a circle (CANTRIP-1)",
        "cast refused: intent is required",
        "threads in the loom: 2",
    ],
    "05_wards.py": [
        "max_turns 50, 10, 100 resolve to: 10",
        "require_done_tool true, false resolve to: True",
        "at max_depth 0: ['done']",
        "terminated: False | truncated: True | max_turns",
        "summary for the caller: Truncated by max_turns after 3 turn(s)",
        "turn 3: gates [] -> truncated (max_turns)",
    ],
    "06_medium.py": [
        "result: Tea is growing, coffee and cocoa are falling: tea 120->170",
        "turn 2 observation ends: error: TypeError",
        "medium js",
        "turn 4: gates [done] -> terminated (done)",
    ],
    "07_codex.py": [
        "result: 3 TODOs in 2 files, summary in out/todos.md",
        "- db.py: TODO: retry on timeout",
        "turn 1: gates [list_dir [error]] [the code raised an error]",
        "medium python",
    ],
    "08_folding.py": [
        "result: 6 pages read; most frequent: ERROR disk full (3x)",
        "[user] [Folded: turns",
        "turns in the loom: 9",
        "turn 8: gates [read_log [error]]",
    ],
    "09_composition.py": [
        "result: one: 7, two: 5, three: 14; total 26",
        "children: 3",
        "[7, 5, {'error': \"cannot spawn child: medium 'bash' is not a sandbox",
        "-> delegating",
        "(child of entity-",
    ],
    "10_loom.py": [
        "first cast: truncated (max_turns)",
        "forked cast: Shipped Monday; it arrives Thursday.",
        "refused: loom is append-only",
        "key redacted: True",
        "rewards: [0.0, 1.0]",
    ],
    "11_persistence.py": [
        "intent 1: Set up weather-cli with src, docs",
        "intent 2: 2 tests planned in src, docs, tests",
        "is closed; summon a new one",
        "after resuming: weather-cli: 3 folders, tests: test_forecast, test_units",
        "one thread across both sessions:",
    ],
    "12_familiar.py": [
        "session 1: calc 1.1: add, divide and mean",
        "a child was cut off by its ward; the familiar got: Truncated by max_turns",
        "session 2: Last time: 2 files; calc.py defines add, divide, mean",
        "medium python",
        "turn 1: gates [read] -> truncated (max_turns)",
    ],
}


def test_every_example_is_covered() -> None:
    scripts = sorted(p.name for p in GRIMOIRE.glob("[0-9][0-9]_*.py"))
    assert scripts == sorted(EXPECTED)
    assert len(scripts) == 12


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_offline(script: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env.update(CANTRIP_OFFLINE="1", TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, str(GRIMOIRE / script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for expected in EXPECTED[script]:
        assert expected in done.stdout, f"{expected!r} missing from:\n{done.stdout}"
    if script not in ("01_query.py", "02_gate.py"):
        assert "--- the loom" in done.stdout  # every run ends by showing its loom
