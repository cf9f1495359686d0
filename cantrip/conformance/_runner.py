"""The conformance runner: executes a tests.yaml file against the public API.

The runner interprets the schema generically. Setup keys become a declarative
spec document plus named scripted LLMs; each action key maps to one public
API call; each expectation key reads the resulting state (cast results, the
loom, the LLMs' recorded queries). It never looks at a case's rule id or name
to decide anything, never fabricates a response, and treats any key it does
not know as a failure.

The runner holds only the loop over cases; each part has its module: reading
the file (:mod:`~cantrip.conformance._cases`), a case's world and its setup
(:mod:`~cantrip.conformance._world`), the actions
(:mod:`~cantrip.conformance._actions`), the expectations
(:mod:`~cantrip.conformance._expectations`, with the checks they share in
:mod:`~cantrip.conformance._checks`) and the value matchers
(:mod:`~cantrip.conformance._matchers`).

Each case runs in its own trio run on a virtual clock (``trio.testing.
MockClock``) that jumps to the next deadline once every task has waited 50 ms
of real time (:func:`_jump_when_idle`): retries still back off for their full
delays, but idle waiting costs no real time. A task waiting on a worker thread
is not idle: the thread works in real time.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import traceback
from collections.abc import Mapping
from math import inf
from pathlib import Path
from typing import Any

import trio
import trio.testing

from cantrip._errors import CantripError
from cantrip.conformance._actions import act, steps
from cantrip.conformance._cases import CASE_KEYS, CaseResult, load_cases
from cantrip.conformance._expectations import Expectations
from cantrip.conformance._matchers import Mismatch, require_keys
from cantrip.conformance._world import build_world


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


IDLE_S = 0.05
"""Real seconds every task must have waited before the virtual clock jumps."""
_TO_THREAD = trio.to_thread.run_sync.__code__


async def _jump_when_idle(clock: trio.testing.MockClock) -> None:
    """Jump ``clock`` to the next deadline whenever every task has waited ``IDLE_S``,
    unless a task waits on a worker thread.

    What ``MockClock(autojump_threshold=...)`` does, but for the threads: a task
    awaiting ``trio.to_thread.run_sync`` is blocked while its thread does real work.
    On a loaded machine a read gate's file read took longer than 50 ms, the clock
    jumped to the gate's 10 s timeout and the case failed with "took longer than
    10 s" (a CIRCLE-10 case, 4 in 300 runs at a load average of 18; every time with
    a 0.3 s read: ``tests/test_conformance_clock.py``). A thread's work is measured
    in real time, as it would be outside the runner."""
    while True:
        await trio.testing.wait_all_tasks_blocked(IDLE_S)
        if _waiting_on_a_thread():
            continue
        jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if 0 < jump < inf:
            clock.jump(jump)


def _waiting_on_a_thread() -> bool:
    """Whether a task of the current run is inside ``trio.to_thread.run_sync``."""
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        if task is None:
            continue
        if any(frame.f_code is _TO_THREAD for frame, _ in task.iter_await_frames()):
            return True
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return False


class Runner:
    """Runs cases; one fresh world per case."""

    def run_file(self, path: str | Path) -> list[CaseResult]:
        return [self.run_case(case) for case in load_cases(path)]

    def run_case(self, case: Mapping[str, Any]) -> CaseResult:
        rule, name = str(case.get("rule", "?")), str(case.get("name", "?"))
        capture = _LogCapture()
        root = logging.getLogger()
        previous_level = root.level
        root.addHandler(capture)
        root.setLevel(logging.DEBUG)
        tmp = Path(tempfile.mkdtemp(prefix="cantrip-case-"))
        try:
            clock = trio.testing.MockClock()
            trio.run(self._run, case, tmp, capture, clock, clock=clock)
        except Mismatch as failure:
            return CaseResult(rule, name, False, str(failure))
        except Exception as exc:  # noqa: BLE001 -- a crashing case is a failed case
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return CaseResult(rule, name, False, f"crashed: {detail}")
        finally:
            root.removeHandler(capture)
            root.setLevel(previous_level)
            shutil.rmtree(tmp, ignore_errors=True)
        return CaseResult(rule, name, True)

    async def _run(
        self,
        case: Mapping[str, Any],
        tmp: Path,
        capture: _LogCapture,
        clock: trio.testing.MockClock,
    ) -> None:
        trio.lowlevel.spawn_system_task(_jump_when_idle, clock)  # ends with the run
        require_keys(case, CASE_KEYS, "case")
        world = build_world(dict(case.get("setup") or {}), tmp)
        world.logs = capture.lines
        try:
            for step in steps(case.get("action")):
                await act(world, step)
        except CantripError as exc:
            world.error = exc
        Expectations(world).check(dict(case.get("expect") or {}))
