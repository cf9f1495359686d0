"""The README's test command is the quick run; CI runs the rest (issue 30.2).

The default run (``pytest`` with the project's settings) uses pytest-xdist and leaves
the tests marked ``soak`` out; ``pytest -m soak`` selects exactly those, and
``.ci/run`` runs both. Timings are not asserted here (speed is measured, not tested):
this checks that the run is configured as the README says.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOAK_FILES = ["tests/test_loom_crash.py", "tests/test_wheel.py"]


def _collect(*args: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-n", "0", "-p", "no:randomly", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_the_default_run_leaves_the_soak_tests_out_and_ci_runs_them() -> None:
    default = _collect(*SOAK_FILES)
    soak = _collect("-m", "soak", *SOAK_FILES)
    assert any("test_kill_9_during_appends" in t for t in soak)
    assert any("test_the_wheel_installs" in t for t in soak)
    assert not set(default) & set(soak)
    assert any("test_the_distribution_name_is_ours" in t for t in default)
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^\.venv/bin/pytest$", ci, re.M), "CI runs the README's command"
    assert re.search(r"^\.venv/bin/pytest -m soak$", ci, re.M), "and then the soak tests"


def test_the_default_run_uses_every_core_and_shows_the_slowest() -> None:
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "addopts"
    ]
    assert "-n auto" in addopts and "--durations=15" in addopts and "not soak" in addopts
    import xdist  # noqa: F401  (the dev extra installs it)
