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
MockClock`` with a small autojump threshold): retries still back off for
their full delays, but idle waiting costs no real time.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import traceback
from collections.abc import Mapping
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
            clock = trio.testing.MockClock(autojump_threshold=0.05)
            trio.run(self._run, case, tmp, capture, clock=clock)
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

    async def _run(self, case: Mapping[str, Any], tmp: Path, capture: _LogCapture) -> None:
        require_keys(case, CASE_KEYS, "case")
        world = build_world(dict(case.get("setup") or {}), tmp)
        world.logs = capture.lines
        try:
            for step in steps(case.get("action")):
                await act(world, step)
        except CantripError as exc:
            world.error = exc
        Expectations(world).check(dict(case.get("expect") or {}))
