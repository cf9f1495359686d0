"""The ``cantrip`` command: ``cast`` a spec file, run ``conformance`` vectors.

Exit codes of ``cast``: 0 terminated (done or a final answer), 2 truncated by
a ward, 1 error (bad spec, LLM failure) -- the message goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from cantrip._errors import CantripError
from cantrip._redact import redact
from cantrip._specfile import build_cantrip, load_spec_file

EXIT_TERMINATED = 0
EXIT_ERROR = 1
EXIT_TRUNCATED = 2


def _own_tests() -> Path:
    """The project's tests.yaml: in the current folder, else beside the package."""
    here = Path.cwd() / "tests.yaml"
    return here if here.exists() else Path(__file__).resolve().parents[1] / "tests.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cantrip", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    cast = commands.add_parser("cast", help="cast a spec file on an intent")
    cast.add_argument("spec", type=Path, help="a cantrip spec file (TOML)")
    cast.add_argument("intent", nargs="?", help="the intent; read from stdin when omitted")
    cast.add_argument("--json", action="store_true", help="print a JSON result")
    cast.add_argument("--loom", type=Path, help="loom file to record into (.db or .jsonl)")

    acp = commands.add_parser(
        "acp", help="serve the Agent Client Protocol on stdio (one JSON message per line)"
    )
    acp.add_argument("spec", type=Path, help="a cantrip spec file (TOML)")
    acp.add_argument("--check", action="store_true", help="load the spec, report, and exit")
    acp.add_argument("--log", type=Path, help="write a debug log to this file (never stdout)")

    conformance = commands.add_parser("conformance", help="run tests.yaml conformance vectors")
    conformance.add_argument("paths", nargs="*", type=Path, help="default: ./tests.yaml")
    conformance.add_argument("-v", "--verbose", action="store_true", help="list passing cases")

    args = parser.parse_args(argv)
    if args.command == "cast":
        return _cast(args)
    if args.command == "acp":
        return _acp(args)
    return _conformance(args)


def _acp(args: argparse.Namespace) -> int:
    import logging

    from cantrip.protocols import serve_stdio

    if args.log is not None:
        logging.basicConfig(filename=args.log, level=logging.DEBUG)
    try:
        spell = build_cantrip(load_spec_file(args.spec), base_dir=args.spec.resolve().parent)
    except CantripError as exc:
        print(f"cantrip: {redact(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    if args.check:
        gates = ", ".join(spell.circle.gate_names)
        print(
            f"ok: {args.spec} loads (medium {spell.circle.medium.name}; gates {gates})",
            file=sys.stderr,
        )
        return 0
    trio.run(serve_stdio, spell)
    return 0


def _cast(args: argparse.Namespace) -> int:
    intent = args.intent if args.intent is not None else sys.stdin.read().strip()
    try:
        doc = load_spec_file(args.spec)
        loom = None
        if args.loom is not None:
            from cantrip.loom._loom import Loom

            loom = Loom.open(args.loom)
        spell = build_cantrip(doc, base_dir=args.spec.resolve().parent, loom=loom)
        outcome = trio.run(spell.cast_async, intent)
    except CantripError as exc:
        print(f"cantrip: {redact(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    loom_path = getattr(spell.loom.store, "path", None)
    if args.json:
        print(
            redact(
                json.dumps(
                    {
                        "result": outcome.result,
                        "terminated": outcome.terminated,
                        "truncated": outcome.truncated,
                        "reason": outcome.reason,
                        "turns": len(outcome.turns),
                        "entity_id": outcome.entity_id,
                        "usage": outcome.usage.to_dict(),
                        "loom": str(loom_path) if loom_path else None,
                        "summary": outcome.summary,
                    },
                    default=str,
                )
            )
        )
    else:
        if outcome.terminated:
            print(redact(outcome.text))
        else:
            print(redact(outcome.summary or "truncated"), file=sys.stderr)
    return EXIT_TERMINATED if outcome.terminated else EXIT_TRUNCATED


def _conformance(args: argparse.Namespace) -> int:
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
