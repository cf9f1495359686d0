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
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from cantrip._cantrip import Cantrip
from cantrip._errors import CantripError
from cantrip._redact import redact
from cantrip._version import __version__
from cantrip.spec import build_cantrip, load_spec_file

EXIT_TERMINATED = 0
EXIT_ERROR = 1
EXIT_TRUNCATED = 2
EXIT_INTERRUPTED = 130
EXIT_BUG = 70
"""An internal error (``EX_SOFTWARE``): a traceback and a "this is a bug" line."""
EXIT_USAGE = 2
"""argparse's code for a command line it cannot parse."""


DESCRIPTION = """\
cantrip runs LLM entities: a model in a loop with an environment (its circle of
gates, medium and wards), every turn recorded in a loom. Each command takes a spec
file (TOML) describing the cantrip; `cantrip init` writes a starter one.
"""
"""What ``cantrip --help`` says first: plain text (the module docstring is for readers of
the code; argparse prints this one)."""

EPILOG = """\
exit codes: 0 done; 1 an error (one line on stderr; --debug for the traceback);
2 truncated by a ward, or a command line that cannot be read; 3 paused for a human
(cast --db); 70 a bug in cantrip; 130 interrupted (Ctrl-C).

Run `cantrip COMMAND --help` for a command's options.
"""

DESCRIPTIONS = {
    "init": "Write a starter spec file that runs offline (its LLM is scripted), with "
    "the lines to change for a real provider.",
    "cast": "Cast the spec's cantrip on one intent and print the result on stdout. On a "
    "terminal, progress (turns, gate calls, streamed text, tokens, cost) is drawn on "
    "stderr. Exit 0 terminated, 2 truncated, 3 paused (--db), 130 interrupted, 1 error.",
    "worker": "Run the casts queued in a PostgreSQL loom. Start any number of workers on "
    "any machines; each entity is owned by one worker at a time through a lease, and "
    "another worker takes over when one dies.",
    "answer": "Answer a cast that paused for a human on the workers (cast --db exits 3 "
    "and prints this command), wait for a worker to carry the answer out, and print "
    "the result like cast.",
    "invoke": "A long-lived entity on the terminal: each line you type is a cast on it, "
    "and its state carries over. Ctrl-C cancels the running cast; Ctrl-D (or Ctrl-C "
    "twice at the prompt) exits.",
    "acp": "Serve the Agent Client Protocol on stdio (one JSON message per line) for "
    "editors such as Zed. Each session is an entity; with a [loom] path, sessions can "
    "be reloaded after a restart.",
    "serve": "Serve the HTTP session API (and the loom viewer at /) for the spec's "
    "cantrip. The API is described at /openapi.json. SIGTERM or Ctrl-C drains running "
    "casts, then stops.",
    "mcp": "Serve the spec's cantrip as a Model Context Protocol server with one tool, "
    "cast: over stdio by default, or streamable HTTP at /mcp with --http.",
    "conformance": "Run conformance vectors (tests.yaml files): one line per failing "
    "case and a final count; a non-zero exit on any failure.",
    "loom": None,  # its own plain description (cantrip.cli._loom.LOOM_HELP)
}
"""Each command's ``--help`` description, plain text."""


def _describe(commands: Any) -> None:
    """Give every subcommand its description (argparse shows none by default)."""
    for name, sub in commands.choices.items():
        text = DESCRIPTIONS.get(name)
        if text:
            sub.description = text


def _own_tests() -> Path:
    """The project's tests.yaml: in the current folder, else beside the package."""
    here = Path.cwd() / "tests.yaml"
    return here if here.exists() else Path(__file__).resolve().parents[1] / "tests.yaml"


def _parser() -> tuple[argparse.ArgumentParser, Any]:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the traceback of any error (also: CANTRIP_DEBUG=1)",
    )
    parser = argparse.ArgumentParser(
        prog="cantrip",
        description=DESCRIPTION,
        epilog=EPILOG,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"cantrip {__version__}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from cantrip.cli._init import add_init_parser

    add_init_parser(commands, parents=[common])

    cast = commands.add_parser("cast", parents=[common], help="cast a spec file on an intent")
    cast.add_argument("spec", type=Path, help="a cantrip spec file (TOML)")
    cast.add_argument("intent", nargs="?", help="the intent; read from stdin when omitted")
    cast.add_argument("--json", action="store_true", help="print a JSON result")
    cast.add_argument("--loom", type=Path, help="loom file to record into (.db or .jsonl)")
    cast.add_argument(
        "-q", "--quiet", action="store_true", help="no progress on stderr, even on a terminal"
    )
    _add_otlp(cast)
    _add_approvals(cast)
    cast.add_argument(
        "--db", metavar="URL", help="enqueue on PostgreSQL for `cantrip worker`s; wait for it"
    )
    cast.add_argument(
        "--check",
        action="store_true",
        help="load the spec, start and list its MCP servers' gates, report, and exit",
    )

    worker = commands.add_parser(
        "worker",
        parents=[common],
        help="run the casts queued in a PostgreSQL loom (any number, any machine)",
    )
    worker.add_argument(
        "--db", metavar="URL", required=True, help="the PostgreSQL loom: postgresql://..."
    )
    worker.add_argument(
        "--concurrency", type=int, default=16, help="entities run at once (default 16)"
    )
    worker.add_argument(
        "--lease",
        type=float,
        default=10.0,
        help="seconds an entity stays owned by this worker without a renewal; after that "
        "another worker may take it over (default 10)",
    )
    worker.add_argument(
        "--max-attempts",
        type=int,
        default=5,
        metavar="N",
        help="attempts of one cast before it is dead-lettered (5); a worker's death costs "
        "an attempt only to a cast it ran alone (in quarantine), not to bystanders",
    )
    worker.add_argument(
        "--drain-s",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long running casts may take to reach their next turn "
        "boundary before they are handed back to the queue at once (default 30; a second "
        "signal hands back at once); a cast handed back costs no attempt",
    )
    worker.add_argument(
        "--dead-letters",
        action="store_true",
        help="list the dead-lettered casts (one JSON object a line) and exit",
    )
    _add_gc_young(worker)
    _add_otlp(worker)

    answer = commands.add_parser(
        "answer",
        parents=[common],
        help="answer a cast paused on the workers (cast --db exit 3); wait for its result",
    )
    answer.add_argument(
        "--db", metavar="URL", required=True, help="the PostgreSQL loom: postgresql://..."
    )
    answer.add_argument("entity_id", help="the paused cast's entity")
    answer.add_argument("pause_id", help="the pause to answer (pause-...)")
    given = answer.add_mutually_exclusive_group(required=True)
    given.add_argument("--approve", action="store_true", help="run the call")
    given.add_argument(
        "--deny", nargs="?", const="", metavar="REASON", help="refuse it (the model sees why)"
    )
    given.add_argument("--answer", metavar="TEXT", help="the reply to an ask_user question")
    answer.add_argument("--json", action="store_true", help="print a JSON result")

    invoke = commands.add_parser(
        "invoke",
        parents=[common],
        help="a long-lived entity: one intent per line, state carried across them",
    )
    invoke.add_argument("spec", type=Path, help="a cantrip spec file (TOML)")
    invoke.add_argument(
        "--resume", metavar="ENTITY_ID", help="continue this entity from the spec's loom file"
    )
    invoke.add_argument("--loom", type=Path, help="loom file to record into (.db or .jsonl)")
    invoke.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    _add_otlp(invoke)
    _add_approvals(invoke)
    invoke.add_argument(
        "--grace-s",
        type=float,
        default=10.0,
        help="on SIGTERM, how long a running cast may finish before it is cut off (default 10)",
    )

    acp = commands.add_parser(
        "acp",
        parents=[common],
        help="serve the Agent Client Protocol on stdio (one JSON message per line)",
    )
    acp.add_argument("spec", type=Path, help="a cantrip spec file (TOML)")
    acp.add_argument("--check", action="store_true", help="load the spec, report, and exit")
    acp.add_argument("--log", type=Path, help="write a debug log to this file (never stdout)")

    serve = commands.add_parser("serve", parents=[common], help="serve the HTTP session API")
    serve.add_argument("spec", type=Path, help="a cantrip spec file (TOML)")
    serve.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="default: 8000 (0: any free port)")
    serve.add_argument("--check", action="store_true", help="load the spec, report, and exit")
    serve.add_argument("--log", type=Path, help="write a debug log to this file")
    serve.add_argument(
        "--db", metavar="URL",
        help="a stateless replica on PostgreSQL: sessions in the database, prompts run by "
        "`cantrip worker --db URL` processes (run any number of replicas)",
    )  # fmt: skip
    _add_otlp(serve)

    from cantrip.cli._mcp import add_mcp_parser

    add_mcp_parser(commands, parents=[common])
    serve.add_argument(
        "--grace-s",
        type=float,
        default=10.0,
        help="on SIGTERM/SIGINT, how long running casts may finish before they are cut off "
        "with reason 'shutdown' (default 10)",
    )
    serve.add_argument(
        "--keep-alive-s",
        type=float,
        default=75.0,
        help="idle keep-alive connections close after this (default 75; keep it above "
        "your clients' pool expiry)",
    )
    serve.add_argument(
        "--heartbeat-s",
        type=float,
        default=15.0,
        help="an event stream with nothing to say gets a comment this often, so proxies "
        "keep it open (default 15; keep it below their idle timeout)",
    )
    serve.add_argument("--backlog", type=int, default=1024, help="listen queue (default 1024)")
    serve.add_argument(
        "--max-running",
        type=int,
        default=1000,
        help="prompts running at once; more get 503 with Retry-After (default 1000)",
    )
    serve.add_argument(
        "--on-busy",
        choices=("reject", "enqueue", "interrupt", "rollback"),
        default="reject",
        help="what a prompt does when its session is already running one, unless the request "
        "says (?on_busy=): reject (409), enqueue, interrupt or rollback (default: reject)",
    )
    serve.add_argument(
        "--a2a-push-private",
        action="store_true",
        help="let A2A push notifications go to loopback and private addresses (a webhook "
        "URL comes from a client: by default only public addresses are called)",
    )
    serve.add_argument(
        "--retain-days",
        type=float,
        default=None,
        metavar="N",
        help="remove entities idle for more than N days from the loom, at start and hourly "
        "(the loom file, or the --db database)",
    )
    _add_gc_young(serve)
    serve.add_argument(
        "--token",
        help="require 'Authorization: Bearer TOKEN' (default: $CANTRIP_TOKEN; "
        "required when --host is not loopback)",
    )
    serve.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME",
        help="also accept this Host header name (repeatable)",
    )  # fmt: skip
    serve.add_argument(
        "--allow-origin", action="append", default=[], metavar="ORIGIN",
        help="accept browser requests from this Origin, e.g. http://localhost:3000 (repeatable)",
    )  # fmt: skip
    serve.add_argument(
        "--max-body", type=int, default=1 << 20, metavar="BYTES",
        help="largest request body (default: 1 MiB; 413 beyond it)",
    )  # fmt: skip
    serve.add_argument(
        "--max-sessions", type=int, default=256, metavar="N",
        help="live sessions kept in memory (default: 256)",
    )  # fmt: skip
    serve.add_argument(
        "--idle-timeout", type=float, default=900.0, metavar="SECONDS",
        help="drop a session idle this long from memory; it resumes from the loom (default: 900)",
    )  # fmt: skip
    serve.add_argument(
        "--client-timeout",
        type=int,
        default=30,
        metavar="SECONDS",
        help="drop a client that sends nothing for this long, or whose body takes longer "
        "(default: 30)",
    )

    conformance = commands.add_parser(
        "conformance", parents=[common], help="run tests.yaml conformance vectors"
    )
    conformance.add_argument(
        "paths", nargs="*", type=Path, help="vector files (default: ./tests.yaml)"
    )
    conformance.add_argument("-v", "--verbose", action="store_true", help="list passing cases")

    from cantrip.cli._eval import add_eval_parser

    add_eval_parser(commands, parents=[common])

    try:
        from cantrip.cli._loom import add_loom_parser  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pass
    else:
        add_loom_parser(commands, parents=[common])
    _describe(commands)
    return parser, commands


def _add_approvals(command: argparse.ArgumentParser) -> None:
    rule = command.add_mutually_exclusive_group()
    rule.add_argument(
        "--approve-all", action="store_true", help="approve every call that asks for approval"
    )
    rule.add_argument(
        "--deny-all", action="store_true", help="deny every call that asks for approval"
    )


def _pause_handler(args: argparse.Namespace, spell: Cantrip, interactive: bool) -> Any:
    """Who answers the circle's pauses: a standing rule, the terminal, or nobody
    (then the command refuses to start rather than wait on a human who is not there)."""
    from cantrip.protocols._human import standing_rule

    if args.approve_all or args.deny_all:
        return standing_rule(approve=args.approve_all)
    if not spell.circle.needs_humans:
        return None
    if interactive:
        return "ask"
    raise CantripError(
        "this circle asks a human before some calls (approve = [...], ask_user, or gates "
        "that require approval) but there is no terminal to ask on: "
        "pass --approve-all or --deny-all"
    )


def _add_gc_young(command: argparse.ArgumentParser) -> None:
    """``--gc-young``: the collector setting of a long-running command
    (:func:`cantrip.cli._process.command_gc`)."""
    command.add_argument(
        "--gc-young",
        type=int,
        default=None,
        metavar="N",
        help="young-generation threshold of the garbage collector while it runs: larger, "
        "rarer collections (default 50000; 0: Python's own)",
    )


def _add_otlp(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--otlp",
        metavar="URL",
        help="send OpenTelemetry traces to this OTLP/HTTP endpoint (needs the otel extra)",
    )


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
    parser, _ = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "otlp", None):
        from cantrip.tracing._setup import configure_otlp

        try:
            shutdown = configure_otlp(args.otlp)
        except CantripError as exc:
            return _fail(str(exc))
        try:
            return _guarded(args)
        finally:
            shutdown()  # flush the spans of this run before the process ends
    return _guarded(args)


def _guarded(args: argparse.Namespace) -> int:
    """Run the command; a user's mistake is one line, a bug its traceback (issue 20)."""
    from cantrip._failure import debug_requested, report

    debug = debug_requested(args)

    try:
        code = _run(args)
        sys.stdout.flush()  # here, where a reader that went away is reported (quietly)
        return code
    except KeyboardInterrupt:
        print("cantrip: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        return report(exc, debug=debug, stream=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    if args.command == "init":
        from cantrip.cli._init import run_init

        return run_init(args)
    if args.command == "cast" and args.db and not args.check:
        from cantrip.cli._worker import cast_on_db

        return cast_on_db(args)
    if args.command == "cast":
        return _cast(args)
    if args.command == "answer":
        from cantrip.cli._worker import answer_on_db

        return answer_on_db(args)
    if args.command == "worker":
        from cantrip.cli._worker import run_worker

        return run_worker(args)
    if args.command == "invoke":
        return _invoke(args)
    if args.command == "acp":
        return _acp(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "mcp":
        from cantrip.cli._mcp import run_mcp

        return run_mcp(args, _load, _fail)
    if args.command == "eval":
        from cantrip.cli._eval import run_eval

        return run_eval(args)
    if args.command == "loom":
        from cantrip.cli._loom import run_loom  # type: ignore[import-not-found,unused-ignore]

        return int(run_loom(args))
    return _conformance(args)


def _fail(message: str) -> int:
    from cantrip._failure import debug_requested
    from cantrip._suggest import without_rule_ids

    text = message if debug_requested() else without_rule_ids(message)
    print(f"cantrip: {redact(text)}", file=sys.stderr)
    return EXIT_ERROR


def _load(spec: Path, loom_path: Path | None = None) -> Cantrip:
    """The spec file's cantrip (a CantripError names every problem at once)."""
    doc = load_spec_file(spec)
    loom = None
    if loom_path is not None:
        from cantrip.loom._loom import Loom

        loom = Loom.open(loom_path)
    return build_cantrip(doc, base_dir=spec.resolve().parent, loom=loom)


def _loom_path(spell: Cantrip) -> Path | None:
    path = getattr(spell.loom.store, "path", None)
    return Path(path) if path else None


def _check(spec: Path, spell: Cantrip) -> int:
    """Report what the spec loads to. Its gate providers (MCP servers) are started,
    listed and stopped, so the check shows their gates -- and any tool renamed
    because LLM providers would refuse its name -- or fails as a cast would."""
    from cantrip._providers import ProviderScope

    circle = spell.circle
    provided: list[tuple[str, str, str | None]] = []
    if circle.providers:

        async def listing() -> list[tuple[str, str, str | None]]:
            scope = await ProviderScope.enter()
            return await scope.listing(circle.providers, circle.gates)

        provided = trio.run(listing)
    gates = ", ".join([*circle.gate_names, *(gate for _, gate, _ in provided)])
    loom = _loom_path(spell)
    print(
        f"ok: {spec} loads (medium {circle.medium.name}; gates {gates}; "
        f"loom {loom or 'in memory'})",
        file=sys.stderr,
    )
    for provider, gate, own in provided:
        if own is not None:
            print(
                f"  {gate}: tool {own!r} of {provider!r} (renamed: LLM providers refuse its name)",
                file=sys.stderr,
            )
    return 0


# -- cast ------------------------------------------------------------------------------


def _cast(args: argparse.Namespace) -> int:
    from cantrip._text import check_text, decode_input, require_intent
    from cantrip.protocols._terminal import (
        Progress,
        cast_with_progress,
        describe_llm,
        wants_progress,
    )

    if args.check:
        spell = _load(args.spec, args.loom)
        try:
            return _check(args.spec, spell)
        finally:
            spell.loom.close()
    if args.intent is None and sys.stdin.isatty():
        print("cantrip: type the intent, then Ctrl-D", file=sys.stderr)
    if args.intent is not None:
        intent = check_text(args.intent, "the intent argument")
    else:
        intent = decode_input(sys.stdin.buffer.read(), "the intent on stdin").strip()
    require_intent(intent)
    spell = _load(args.spec, args.loom)
    progress = Progress(enabled=wants_progress(sys.stderr, args.quiet), llm=describe_llm(spell.llm))
    try:
        on_pause = _pause_handler(args, spell, args.intent is not None and sys.stdin.isatty())
        if on_pause == "ask":
            from cantrip.protocols._human import TerminalHuman
            from cantrip.protocols._terminal import stderr_console

            on_pause = TerminalHuman(stderr_console(), _stdin_line, progress.held)
        outcome, interrupted = trio.run(cast_with_progress, spell, intent, progress, on_pause)
    finally:
        spell.loom.close()
    loom_path = _loom_path(spell)
    if args.json:
        from cantrip._outcome import result_dict
        from cantrip.cli._output import print_cast_json

        print_cast_json(result_dict(outcome), loom=str(loom_path) if loom_path else None)
    elif outcome is not None and outcome.terminated:
        print(redact(outcome.text))
    elif outcome is not None and outcome.reason != "cancelled":
        print(redact(outcome.summary or "truncated"), file=sys.stderr)
    if interrupted or outcome is None or outcome.reason == "cancelled":
        if not args.json:
            print("cantrip: interrupted; the cast is recorded as cancelled", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_TERMINATED if outcome.terminated else EXIT_TRUNCATED


async def _stdin_line() -> str | None:
    """One line from stdin, read in a worker thread (a blocking read the run can abandon)."""
    line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return line.rstrip("\n") if line else None


# -- invoke ----------------------------------------------------------------------------


def _invoke(args: argparse.Namespace) -> int:
    from cantrip.protocols._terminal import (
        Invocation,
        Progress,
        describe_llm,
        print_out,
        stderr_console,
        wants_progress,
    )

    spell = _load(args.spec, args.loom)
    try:
        if args.resume is not None:
            if _loom_path(spell) is None:
                return _fail(
                    "--resume needs a loom file: add [loom] path = ... to the spec (or --loom)"
                )
            record = spell.loom.entities.get(args.resume)
            if record is None or record.parent_entity_id is not None:
                return _fail(f"no entity {args.resume!r} in {_loom_path(spell)}")
        console = stderr_console()
        try:
            on_pause = _pause_handler(args, spell, sys.stdin.isatty())
        except CantripError as exc:
            return _fail(str(exc))
        invocation = Invocation(
            spell,
            entity_id=args.resume,
            out=print_out,
            err=console,
            progress=Progress(
                console,
                enabled=wants_progress(sys.stderr, args.quiet),
                llm=describe_llm(spell.llm),
            ),
            interactive=sys.stdin.isatty(),
            on_pause=on_pause,
            grace_s=args.grace_s,
        )
        return trio.run(invocation.run)
    finally:
        spell.loom.close()


# -- protocols ---------------------------------------------------------------------------


def _debug_log(path: Path | None) -> None:
    if path is not None:
        logging.basicConfig(
            filename=path,
            level=logging.DEBUG,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )


def _acp(args: argparse.Namespace) -> int:
    from cantrip.protocols import serve_stdio

    _debug_log(args.log)
    spell = _load(args.spec)
    if args.check:
        return _check(args.spec, spell)
    try:
        trio.run(serve_stdio, spell)
    except KeyboardInterrupt:
        pass
    finally:
        spell.loom.close()
    return 0


def _serve(args: argparse.Namespace) -> int:
    from cantrip.cli._process import command_gc
    from cantrip.cli._serve import serve_until_signal
    from cantrip.protocols._asgi import set_heartbeat_s
    from cantrip.protocols._guard import BindError, Guard
    from cantrip.protocols._http import serve_http
    from cantrip.protocols._lifecycle import ServeOptions
    from cantrip.protocols._limits import SessionLimits

    _debug_log(args.log)
    try:
        guard = Guard(
            bind_host=args.host,
            allow_hosts=frozenset(h.lower() for h in args.allow_host),
            allow_origins=frozenset(args.allow_origin),
            token=_token(args.token),
            max_body=args.max_body,
            body_timeout_s=float(args.client_timeout),
        )
        guard.check_bind()
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port {args.port} is not a port number (0-65535; 0: any free)")
        limits = SessionLimits(max_sessions=args.max_sessions, idle_s=args.idle_timeout)
        set_heartbeat_s(args.heartbeat_s)
        collector = command_gc(args.gc_young)
    except (BindError, ValueError) as exc:
        return _fail(str(exc))
    options = ServeOptions(
        grace_s=args.grace_s,
        keep_alive_s=args.keep_alive_s,
        backlog=args.backlog,
        max_running=args.max_running,
        on_busy=args.on_busy,
        a2a_push_private=args.a2a_push_private,
    )
    if args.db:
        from cantrip.cli._worker import serve_on_db

        return serve_on_db(args, guard, options, collector)
    spell = _load(args.spec)
    if args.check:
        return _check(args.spec, spell)
    background = None
    if args.retain_days is not None:
        from cantrip.loom._retention import keep_retained, loom_location

        location = loom_location(spell.loom)
        if location is None:
            return _fail(
                "--retain-days needs a loom file ([loom] path, or --db): this loom is in memory"
            )
        background = functools.partial(keep_retained, location, args.retain_days)

    start = functools.partial(
        serve_http,
        spell,
        args.host,
        args.port,
        options=options,
        guard=guard,
        limits=limits,
        read_timeout_s=args.client_timeout,
    )
    try:
        with collector:
            failure = serve_until_signal(
                start,
                host=args.host,
                port=args.port,
                spec=args.spec,
                draining=f"draining (grace {options.grace_s:g} s)",
                background=background,
            )
        if failure is not None:
            return _fail(failure)
    finally:
        spell.loom.close()
    return 0


def _token(flag: str | None) -> str | None:
    """The serve token: ``--token`` or ``$CANTRIP_TOKEN``. A token given as a flag is put
    into ``CANTRIP_TOKEN`` too, so the redactor knows its value (PROD-8)."""
    if flag:
        os.environ["CANTRIP_TOKEN"] = flag
    return os.environ.get("CANTRIP_TOKEN") or None


# -- conformance -------------------------------------------------------------------------


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
