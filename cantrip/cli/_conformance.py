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

NO_VECTORS = (
    "cantrip: no tests.yaml in this folder; name the vector files to run: "
    "cantrip conformance PATH/tests.yaml (cantrip's own vectors are tests.yaml at the root "
    "of its repository; the installed package carries none)"
)


def run_conformance(args: argparse.Namespace) -> int:
    """Run the named vector files, or ./tests.yaml; with neither, say where vectors are
    (issue 47.6: a path inside the installed package was reported as missing before)."""
    from cantrip.conformance import Runner, summarize

    paths = args.paths or [Path.cwd() / "tests.yaml"]
    if not args.paths and not paths[0].exists():
        print(NO_VECTORS, file=sys.stderr)
        return EXIT_ERROR
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
