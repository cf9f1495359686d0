"""``cantrip eval``: run a suite, compare two reports, turn a recorded cast into a case.

    cantrip eval SUITE [--spec SPEC] [--concurrency N] [--repeat K] [--json FILE]
                       [--junit FILE] [--loom FILE] [--record LOOM | --replay [LOOM]]
                       [--max-cost-usd X]
    cantrip eval compare A.json B.json
    cantrip eval add LOOM REF --suite SUITE [--name NAME] [--spec SPEC]

Exit codes: 0 every case passed, 1 a case failed or errored (or the input was
wrong: one line says which), 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import trio

from cantrip._errors import CantripError
from cantrip.cli._exit import EXIT_USAGE
from cantrip.cli._grammar import SUITE_RECORDING
from cantrip.cli._grammar import add_eval_parser as add_eval_parser


def run_eval(args: argparse.Namespace) -> int:
    """Exit 0 all passed, 1 any case failed or errored, 2 nothing could run (a usage
    error, a malformed suite or spec, a missing recording: one line says which)."""
    try:
        return _run_eval(args)
    except CantripError as exc:
        from cantrip._redact import redact

        return _usage(redact(str(exc)))


def _run_eval(args: argparse.Namespace) -> int:
    if args.target == "compare":
        return _compare(args)
    if args.target == "add":
        return _add(args)
    if args.more:
        return _usage(f"unexpected arguments after the suite: {' '.join(args.more)}")
    if args.concurrency < 1 or args.repeat < 1:
        return _usage("--concurrency and --repeat must be at least 1")
    from cantrip.evals import load_suite, run_suite
    from cantrip.evals._report import failure_lines, junit_xml, table

    suite = load_suite(args.target)
    replay: Path | None = None
    if args.replay == SUITE_RECORDING:
        if suite.recording is None:
            return _usage(f"{args.target}: the suite names no 'recording': give --replay LOOM")
        replay = suite.recording
    elif args.replay is not None:
        replay = Path(args.replay)
    if replay is not None and not replay.exists():
        return _usage(f"{replay}: no such recording")
    progress = _Progress(len(suite.cases) * args.repeat)
    report = trio.run(
        lambda: run_suite(
            suite,
            spec=args.spec,
            record=args.record,
            replay=replay,
            loom=args.loom,
            concurrency=args.concurrency,
            repeat=args.repeat,
            max_cost_usd=args.max_cost_usd,
            on_result=progress.advance,
        )
    )
    progress.close()
    for line in failure_lines(report):
        print(line)
    print(table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    if args.junit is not None:
        args.junit.write_text(junit_xml(report), encoding="utf-8")
    return 0 if report.passed else 1


class _Progress:
    """A live bar on a terminal; nothing otherwise (reports stay clean in CI logs)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.live = sys.stderr.isatty()

    def advance(self, run: Any) -> None:
        self.done += 1
        self.failed += run.status != "passed"
        if self.live:
            width = 30
            filled = width * self.done // max(1, self.total)
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                f"  {self.failed} not passed"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.live:
            sys.stderr.write("\n")


def _compare(args: argparse.Namespace) -> int:
    if len(args.more) != 2:
        return _usage("eval compare takes two JSON reports: cantrip eval compare A.json B.json")
    from cantrip.evals._report import compare, compare_text, read_report

    a, b = (read_report(path) for path in args.more)
    result = compare(a, b)
    print(compare_text(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 1 if result["regressions"] else 0


def _add(args: argparse.Namespace) -> int:
    if len(args.more) != 2 or args.suite is None:
        return _usage("eval add takes a loom and a reference: cantrip eval add LOOM REF --suite S")
    from cantrip.evals import add_case
    from cantrip.loom._loom import Loom

    loom_path, ref = args.more
    if not Path(loom_path).exists():
        return _usage(f"{loom_path}: no such loom")
    if args.spec is None and not _names_a_spec(args.suite):
        return _usage(
            f"{args.suite} names no spec to run its cases against: give --spec SPEC "
            "(written into the suite, so the next eval --replay runs)"
        )
    loom = Loom.open(loom_path)
    try:
        case = add_case(
            loom, ref, args.suite, name=args.name, spec=str(args.spec) if args.spec else None
        )
    finally:
        loom.close()
    print(f"added case {case.name!r} to {args.suite}")
    return 0


def _names_a_spec(suite: Path) -> bool:
    """Whether the suite file exists and has a top-level ``spec`` already."""
    if not suite.exists():
        return False
    import yaml

    data = yaml.safe_load(suite.read_text(encoding="utf-8"))
    return isinstance(data, dict) and data.get("spec") is not None


def _usage(message: str) -> int:
    print(f"cantrip eval: {message}", file=sys.stderr)
    return EXIT_USAGE


__all__ = ["add_eval_parser", "run_eval"]
