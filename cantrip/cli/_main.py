"""The ``cantrip`` command: cast, invoke, serve a spec file (ACP or HTTP), run conformance.

Every command builds the same :class:`~cantrip.Cantrip` from the same spec
file and reaches its entities through ``Entity.send`` (PROD-1).

Exit codes of ``cast``: 0 terminated (done or a final answer), 2 truncated by
a ward, 130 interrupted (Ctrl-C; the loom records the cast as cancelled), 1
error (bad spec, LLM failure) -- the message goes to stderr; with ``--db``, 3
paused (the cast waits for a human: ``cantrip answer``). Progress is drawn
on stderr when it is a terminal; stdout carries only the result.

Every command reports a mistake in its input -- a file that is missing or not
what it should be, text that is not UTF-8, a bad spec, a damaged loom -- as one
line on stderr (``cantrip: ...``, exit 1), never a traceback. Anything else is
a bug in cantrip: it prints the traceback and a line saying so (exit 70).
``--debug`` (or ``CANTRIP_DEBUG=1``) shows the traceback of any error.

This module is the process around a command: it parses the command line
(:mod:`._parser`), installs tracing when asked, guards the run (a mistake is one
line, a bug a traceback) and hands the command to the module that runs it
(:mod:`._cast`, :mod:`._protocols`, :mod:`._worker`, :mod:`._conformance`, ...),
imported only when that command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cantrip._errors import CantripError
from cantrip.cli._exit import EXIT_INTERRUPTED, EXIT_USAGE, fail, json_errors
from cantrip.cli._parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a ``cantrip`` command; the exit code. A reader that went away (``| head``),
    even from ``--help``, ends it quietly (``cantrip._failure.closed_pipe``)."""
    from cantrip._failure import closed_pipe, is_closed_pipe

    try:
        return _main(argv)
    except BrokenPipeError as exc:
        if not is_closed_pipe(exc):
            raise
        return closed_pipe()


def _main(argv: Sequence[str] | None) -> int:
    from cantrip.cli._process import escape_unencodable_output, raise_open_files_limit

    escape_unencodable_output()
    raise_open_files_limit()  # a connection per entity in flight (default_connections)
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "otlp", None):
        from cantrip.tracing._setup import configure_otlp

        try:
            shutdown = configure_otlp(args.otlp)
        except CantripError as exc:
            return fail(str(exc))
        try:
            return _guarded(args)
        finally:
            shutdown()  # flush the spans of this run before the process ends
    return _guarded(args)


def _guarded(args: argparse.Namespace) -> int:
    """Run the command; a user's mistake is one line, a bug its traceback (issue 20);
    under ``--json`` (a flag; ``eval --json`` names a file) each is also a JSON object
    on stdout (issue 47.6)."""
    from cantrip._failure import debug_requested, report

    debug = debug_requested(args)
    as_json = getattr(args, "json", None) is True

    try:
        with json_errors(as_json):
            code = _run(args)
        sys.stdout.flush()  # here, where a reader that went away is reported (quietly)
        return code
    except KeyboardInterrupt:
        print("cantrip: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        return report(exc, debug=debug, stream=sys.stderr, json_out=sys.stdout if as_json else None)


def _run(args: argparse.Namespace) -> int:
    if args.command == "init":
        from cantrip.cli._init import run_init

        return run_init(args)
    if args.command == "cast" and args.intents is not None and (not args.db or args.check):
        print("cantrip: --intents queues casts for workers: give it with --db", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "cast" and args.db and args.intents is not None:
        from cantrip.cli._worker import casts_on_db

        return casts_on_db(args)
    if args.command == "cast" and args.db and not args.check:
        from cantrip.cli._worker import cast_on_db

        return cast_on_db(args)
    if args.command == "cast":
        from cantrip.cli._cast import run_cast

        return run_cast(args)
    if args.command == "answer":
        from cantrip.cli._worker import answer_on_db

        return answer_on_db(args)
    if args.command == "worker":
        from cantrip.cli._worker import run_worker

        return run_worker(args)
    if args.command == "invoke":
        from cantrip.cli._cast import run_invoke

        return run_invoke(args)
    if args.command == "acp":
        from cantrip.cli._protocols import run_acp

        return run_acp(args)
    if args.command == "serve":
        from cantrip.cli._protocols import run_serve

        return run_serve(args)
    if args.command == "mcp":
        from cantrip.cli._mcp import run_mcp
        from cantrip.cli._spec_file import load_cantrip

        return run_mcp(args, load_cantrip, fail)
    if args.command == "eval":
        from cantrip.cli._eval import run_eval

        return run_eval(args)
    if args.command == "memory":
        from cantrip.cli._memory import run_memory

        return run_memory(args)
    if args.command == "loom":
        from cantrip.cli._loom import run_loom  # type: ignore[import-not-found,unused-ignore]

        return int(run_loom(args))
    from cantrip.cli._conformance import run_conformance

    return run_conformance(args)
