"""The command line's grammar: every command, its arguments and its ``--help`` text.

Building the parser is one long declaration, kept apart from running the commands
(:mod:`cantrip.cli._main` dispatches them) so that each reads alone; the docs build
the command reference from it (``docs/hooks.py``). Commands whose options live with
their code add their own subparser (``init``, ``mcp``, ``eval``, ``loom``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cantrip._version import __version__
from cantrip.cli._grammar import (
    add_eval_parser,
    add_loom_parser,
    add_mcp_parser,
    add_memory_parser,
)

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
(cast --db); 4 refused by a guardrail; 70 a bug in cantrip; 130 interrupted (Ctrl-C).

Run `cantrip COMMAND --help` for a command's options.
"""

DESCRIPTIONS = {
    "init": "Write an example that ships with cantrip into a folder: by default "
    "hello.toml, a spec that runs offline (its LLM is scripted) with the lines to change "
    "for a real provider; 'cantrip init --list' names the others (evals, a slow model for "
    "steering, one per provider, ...).",
    "cast": "Cast the spec's cantrip on one intent and print the result on stdout. On a "
    "terminal, progress (turns, gate calls, streamed text, tokens, cost) is drawn on "
    "stderr. Exit 0 terminated, 2 truncated, 3 paused (--db), 4 refused by a guardrail, "
    "130 interrupted, 1 error.",
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
    "loom": None,  # its own plain description (cantrip.cli._grammar.LOOM_HELP)
    "memory": None,  # its own plain description (cantrip.cli._grammar.MEMORY_HELP)
}
"""Each command's ``--help`` description, plain text."""


def _describe(commands: Any) -> None:
    """Give every subcommand its description (argparse shows none by default)."""
    for name, sub in commands.choices.items():
        text = DESCRIPTIONS.get(name)
        if text:
            sub.description = text


class _Parser(argparse.ArgumentParser):
    """An argparse parser that reports words it does not know itself (issue 47.6).

    Plain argparse hands a subcommand's unknown words up to the top-level parser,
    which reports them under ``usage: cantrip COMMAND ...`` -- no help to someone
    who mistyped an option of ``cast``. Every parser of the tree is this class
    (argparse makes subparsers of their parent's class), so the innermost command
    given rejects them with its own usage, and names the option that was probably
    meant. The exit code stays argparse's (``EXIT_USAGE``).
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(_unrecognized(self, extras))
        return parsed, extras


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's message, and ``did you mean --x?`` for each unknown option close
    to one of ``parser``'s (difflib, loaded only on this error path)."""
    from cantrip._suggest import close_match

    known = [o for o in parser._option_string_actions if o.startswith("--")]
    lines = [f"unrecognized arguments: {' '.join(extras)}"]
    for word in extras:
        if word.startswith("--"):
            match = close_match(word.split("=", 1)[0], known)
            if match is not None:
                lines.append(f"did you mean {match}?")
    return "\n".join(lines)


def build_parser() -> tuple[argparse.ArgumentParser, Any]:
    common = _Parser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the traceback of any error (also: CANTRIP_DEBUG=1)",
    )
    parser = _Parser(
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
        "--intents",
        metavar="FILE",
        help="with --db: one intent per line of FILE ('-': stdin), each cast on a new entity, "
        "all queued in one commit; the results are printed in the same order",
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
        "--worker-id",
        metavar="ID",
        help="a stable identity (e.g. HOST:SLOT from your process supervisor): a worker "
        "started under the identity of one that died takes its casts back at once, instead "
        "of after their leases run out; the old process, if it still runs, can write nothing "
        "more to them (default: a new identity per process)",
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
    acp.add_argument(
        "--db",
        metavar="URL",
        help="sessions on PostgreSQL, as `serve --db`: prompts run by `cantrip worker --db URL` "
        "processes, sessions listed, resumed and deleted from the database",
    )
    acp.add_argument(
        "--protocol",
        choices=("v1", "v2-draft"),
        default="v1",
        help="v2-draft: also speak the ACP v2 draft with a client that asks for version 2 "
        "(prompts acknowledged, an explicit idle state, several clients per session)",
    )

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
        "--session-budget", action="append", default=[], metavar="WARD=N",
        help="what each session may spend over all its prompts, children included: "
        "max_tokens_total, max_cost_usd, max_gate_calls or max_children (repeatable; a "
        "client cannot raise it)",
    )  # fmt: skip
    serve.add_argument(
        "--token-budget", action="append", default=[], metavar="WARD=N",
        help="what all sessions served under the bearer token may spend together (without "
        "--token: the whole server), as --session-budget (repeatable)",
    )  # fmt: skip
    serve.add_argument(
        "--client-timeout",
        type=int,
        default=30,
        metavar="SECONDS",
        help="drop a client that stops sending its request for this long, or whose body "
        "takes longer; an answer may take as long as it runs (default: 30)",
    )

    conformance = commands.add_parser(
        "conformance", parents=[common], help="run tests.yaml conformance vectors"
    )
    conformance.add_argument(
        "paths", nargs="*", type=Path, help="vector files (default: ./tests.yaml)"
    )
    conformance.add_argument("-v", "--verbose", action="store_true", help="list passing cases")

    add_eval_parser(commands, parents=[common])
    add_loom_parser(commands, parents=[common])
    add_memory_parser(commands, parents=[common])
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
