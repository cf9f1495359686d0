"""A line on the terminal as each test module finishes (issue 47.6).

Quiet runs under pytest-xdist print only dots: on a loaded two-core machine that was
twenty minutes with no sign of where the run stood. This plugin counts each module's
tests as their reports arrive (on the xdist controller, or in a run without xdist)
and, when a module's last test is done, writes ``tests/test_x.py: 42 passed, 12.3 s
[7/160]``. It only reads reports; it changes no outcome.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import pytest


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class ModuleProgress:
    """Counts tests per module and names each module when its last test is done."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.expected: Counter[str] = Counter()
        self.done: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.finished = 0

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: Sequence[str]) -> None:
        if not self.expected:  # every worker collects the same tests
            self.expected = Counter(_module(nodeid) for nodeid in ids)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:  # a run without xdist (the controller of one collects nothing)
            self.expected = Counter(_module(item.nodeid) for item in session.items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = _module(report.nodeid)
        self.seconds[module] += report.duration
        if report.failed:
            self.failed[module] += 1
        if report.when != "teardown" or module not in self.expected:
            return
        self.done[module] += 1
        if self.done[module] == self.expected[module]:
            self.finished += 1
            self._tell(module)

    def _tell(self, module: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if reporter._tw.width_of_current_line:  # after a row of dots
            reporter.write("\n")
        failed, done = self.failed[module], self.done[module]
        outcome = f"{failed} FAILED of {done}" if failed else f"{done} done"
        reporter.write_line(
            f"{module}: {outcome}, {self.seconds[module]:.1f} s "
            f"[{self.finished}/{len(self.expected)}]"
        )


def register(config: pytest.Config) -> None:
    """Register once (a conftest may be imported twice), and only in the process that
    writes the terminal: the controller of an xdist run, or a run without workers."""
    if hasattr(config, "workerinput") or config.pluginmanager.has_plugin("module_progress"):
        return
    config.pluginmanager.register(ModuleProgress(config), "module_progress")
