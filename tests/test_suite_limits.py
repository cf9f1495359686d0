"""The test suite's own limits: a hung test fails instead of hanging the run (issue 29).

pytest has no time limit of its own; ``pyproject.toml`` gives every test one through
pytest-timeout (300 s by default, ``@pytest.mark.timeout(N)`` where a test needs
longer). Checked here on a real pytest run of a trio test that never returns, under
this project's configuration with the limit shortened. A trio test is cancelled the
trio way at its limit (tests/time_limit.py): pytest-timeout's own SIGALRM handler raises
inside trio's run loop and breaks trio for every later test. A trio test that ignores
that cancellation ends the run, naming itself, after a grace period.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from time_limit import EXIT_STUCK

ROOT = Path(__file__).resolve().parents[1]

HANGS = """
import time
import trio

async def test_hangs() -> None:
    await trio.sleep_forever()

async def test_a_trio_test_after_it_runs() -> None:
    await trio.sleep(0)

def test_a_plain_test_hangs() -> None:
    time.sleep(600)

async def test_autojump_time_is_not_real_time(autojump_clock) -> None:
    await trio.sleep(3600)  # an hour of virtual time: well within the limit
"""


def test_a_hung_trio_test_fails_on_the_time_limit_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(HANGS)
    plugins = ["-p", "conftest", "-p", "no:randomly", "-p", "no:cacheprovider"]
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=2"]
    config += ["-o", "addopts=-q"]  # one process, the default summary (not the suite's -n/-rs)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *config, *plugins, str(tmp_path / "test_hang.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},  # this suite's conftest
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "FAILED test_hang.py::test_hangs - Failed: Timeout (>2s)" in out, out
    assert "FAILED test_hang.py::test_a_plain_test_hangs - Failed: Timeout (>2.0s)" in out, out
    assert "2 failed, 2 passed" in out, out  # trio is clean for the tests after a timeout


def test_the_default_limit_is_generous_for_the_slow_machine() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert options["ini_options"]["timeout"] >= 300


ONLY_NAMED_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

STUCK = """
import trio

async def test_ignores_cancellation() -> None:
    with trio.CancelScope(shield=True):
        await trio.sleep(600)

async def test_after_it() -> None:
    await trio.sleep(0)
"""


SAYS_STUCK = (
    "test_stuck.py::test_ignores_cancellation did not end 1 s after it was cancelled at "
    "its time limit (it ignores cancellation): the test run is ended"
)


def _run_stuck(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """A pytest run of :data:`STUCK` (time limit 1 s, grace 1 s): what it did, how long."""
    (tmp_path / "test_stuck.py").write_text(STUCK)
    # only the plugins this needs (every installed one takes seconds to import)
    plugins = ["-p", "pytest_trio.plugin", "-p", "pytest_timeout", "-p", "conftest", *options]
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "addopts=-q"]
    config += ["-o", "timeout=1", "-o", "timeout_grace=1"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *config, *plugins, str(tmp_path / "test_stuck.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests"), **ONLY_NAMED_PLUGINS},
    )
    return done, time.monotonic() - started


def test_a_trio_test_that_ignores_cancellation_ends_the_run_saying_so(tmp_path: Path) -> None:
    """Nothing else would stop it: the run ends ``timeout_grace`` seconds after the
    test was cancelled, with its name and every thread's stack on the real stderr (not
    the captured one, lost with the process) and a status that is not success."""
    done, took = _run_stuck(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == EXIT_STUCK != 0, out
    assert SAYS_STUCK in done.stderr, out
    assert 'test_stuck.py", line 6 in test_ignores_cancellation' in done.stderr, out  # its stack
    assert "test_after_it" not in out and "passed" not in out, out
    assert took < 100, out  # ended, not the shielded sleep run out


def test_under_xdist_a_trio_test_that_ignores_cancellation_ends_its_worker_saying_so(
    tmp_path: Path,
) -> None:
    """The README's run (pytest-xdist): the worker running it ends, saying why on the
    terminal; xdist reports the test crashed and goes on with a new worker."""
    done, took = _run_stuck(tmp_path, "-p", "xdist.plugin", "-n", "1")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert SAYS_STUCK in done.stderr, out
    assert "crashed while running 'test_stuck.py::test_ignores_cancellation'" in out, out
    assert "1 failed, 1 passed" in out, out
    assert took < 100, out
