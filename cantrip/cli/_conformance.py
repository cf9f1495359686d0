"""``cantrip conformance``: run tests.yaml conformance vectors and report.

One line per failing case (``-v``: per passing case too) and a final count; the
exit code is an error when any case fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cantrip._errors import CantripError
from cantrip.cli._exit import EXIT_ERROR


def _own_tests() -> Path:
    """The project's tests.yaml: in the current folder, else beside the package."""
    here = Path.cwd() / "tests.yaml"
    return here if here.exists() else Path(__file__).resolve().parents[1] / "tests.yaml"


def run_conformance(args: argparse.Namespace) -> int:
    from cantrip.conformance import Runner, summarize

    paths = args.paths or [_own_tests()]
    results = []
    runner = Runner()
    for path in paths:
        try:
            file_results = runner.run_file(path)
        except (OSError, CantripError) as exc:
            print(f"cantrip: cannot run {path}: {exc}", file=sys.stderr)
            return EXIT_ERROR
        for result in file_results:
            if not result.passed:
                print(f"FAIL {path.name} {result.label}: {result.message}")
            elif args.verbose:
                print(f"ok   {path.name} {result.label}")
        results.extend(file_results)
    print(summarize(results))
    return 0 if all(r.passed for r in results) else EXIT_ERROR
