"""The grammar of the commands whose code is heavy: ``loom``, ``memory``, ``eval`` and
``mcp``.

``cantrip --help`` (and every command) builds the whole parser, so the grammar of a
command must not import what the command runs: the loom, the spec loader, trio. Each
command's module imports its grammar from here; nothing here imports beyond the
standard library (``cantrip --version`` is measured by tests/test_lean_install.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SUITE_RECORDING = "suite's recording"
"""``eval --replay`` with no LOOM: the suite's own ``recording``."""

LOOM_HELP = """\
Inspect, export, reward and fork from a loom file. FILE is a loom written by
`cantrip cast --loom` or a spec's [loom] path: .jsonl or SQLite.

REF names a turn: a turn id, or a unique prefix or suffix of one ("turn-" may be
left out of a prefix); ENTITY:SEQ, turn SEQ of that entity's thread (the entity id
may be a unique prefix); #N, the last turn of thread N as `list` numbers them; or
an entity id, meaning its latest turn.

Everything printed has its secrets redacted, except `export --raw`. A file that is
not a loom is refused and never written to; a damaged loom's error names `check`
and `recover`.

exit codes: 0 success (fork: the cast terminated), 2 fork truncated by a ward,
1 error (check: the loom is damaged)
"""
"""The plain-text description ``cantrip loom --help`` prints (the module docstring is
for readers of the code; this is for users, so no markup or rule ids)."""


def add_loom_parser(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """Add the ``loom`` command (with its subcommands) to a ``cantrip`` parser."""
    loom = subparsers.add_parser(
        "loom",
        parents=list(parents),
        help="inspect, export, reward or fork from a loom file",
        description=LOOM_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    loom.add_argument(
        "loom_file",
        type=loom_location,
        metavar="FILE",
        help="a loom file (.db or .jsonl), or a postgresql:// URL",
    )
    commands = loom.add_subparsers(dest="loom_command", required=True, metavar="COMMAND")

    listing = commands.add_parser(
        "list",
        help="entities and threads, with outcome and usage",
        description="List every entity (medium, parent or fork origin, turns, tokens, "
        "cost) and every thread (last turn, entity, length, outcome, tokens, reward).",
    )
    listing.add_argument("--json", action="store_true", help="print JSON")

    show = commands.add_parser(
        "show",
        help="a thread, turn by turn",
        description="Show the thread from its root to a turn: each turn's utterance, "
        "thinking, gate calls, observation, tokens, duration, outcome and reward.",
    )
    show.add_argument(
        "ref", metavar="REF", help="the turn: #N, a turn id or its prefix, ENTITY:SEQ, an entity"
    )
    show.add_argument("--full", action="store_true", help="do not shorten long texts")

    export = commands.add_parser(
        "export",
        help="export turns, chat-format training data or traces",
        description="Write the loom (or one thread) to stdout, secrets redacted.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="formats:\n"
        "  jsonl  one turn per line, every field of the turn plus its reward (the default;\n"
        "         cantrip.load_jsonl reads it back)\n"
        "  chat   training data: one conversation per thread in OpenAI's fine-tuning\n"
        "         shape (messages with tool calls), with outcome and rewards\n"
        "  otlp   OpenTelemetry traces as OTLP/JSON (GenAI conventions, no message text)",
    )
    export.add_argument(
        "--format",
        choices=("jsonl", "chat", "otlp"),
        default="jsonl",
        help="jsonl (default), chat or otlp: see below",
    )
    export.add_argument("--thread", metavar="REF", help="only the thread ending at REF")
    export.add_argument(
        "--raw", action="store_true", help="do not redact secrets (an explicit opt-in)"
    )

    reward = commands.add_parser(
        "reward",
        help="set a turn's reward",
        description="Set or clear a turn's reward: the one change a loom allows.",
    )
    reward.add_argument("ref", metavar="REF", help="the turn (see cantrip loom --help)")
    reward.add_argument("value", metavar="VALUE", help="a number, or none to clear it")

    fork = commands.add_parser(
        "fork",
        help="continue from a turn with a spec file's cantrip",
        description="Cast a new intent from a recorded turn with the cantrip a spec file "
        "describes, recording into the same loom; the original thread is untouched.",
    )
    fork.add_argument("ref", metavar="REF", help="the turn to continue from")
    fork.add_argument("spec", type=Path, metavar="SPEC.toml", help="a cantrip spec file (TOML)")
    fork.add_argument("intent", metavar="INTENT", help="the new intent")
    fork.add_argument("--llm", help="a named LLM of the spec ([llms.NAME]) to continue with")
    fork.add_argument("--json", action="store_true", help="print a JSON result")
    view = commands.add_parser(
        "view",
        help="browse the loom in a web browser (read-only)",
        description="Serve a read-only web page over the loom; prints its URL and opens "
        "nothing. Bound beyond 127.0.0.1 it needs a token.",
    )
    view.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1")
    view.add_argument("--port", type=int, default=0, help="default: 0 (any free port)")
    view.add_argument(
        "--token", help="require this bearer token (default: CANTRIP_TOKEN; needed off loopback)"
    )

    checking = commands.add_parser(
        "check",
        help="integrity check: what is readable (read-only)",
        description="Run SQLite's integrity check and count what is readable; reads only. "
        "Exit 0 intact, 1 damaged.",
    )
    checking.add_argument("--json", action="store_true", help="print JSON")
    recovering = commands.add_parser(
        "recover",
        help="copy the complete turns of a damaged loom into a new file",
        description="Copy every complete turn (readable, with its entity and parent) of a "
        "damaged or truncated loom into a new file; the damaged one is only read.",
    )
    recovering.add_argument("out", type=Path, metavar="NEW", help="the new loom file to write")
    recovering.add_argument("--json", action="store_true", help="print JSON")
    pruning = commands.add_parser(
        "prune",
        help="remove whole entities (with their children) to keep the loom bounded",
        description="Remove whole root entities with everything they spawned, their turns and "
        "gate-journal rows; a tree another entity was forked from, or one still running, stays. "
        "The loom stays valid and its space is reclaimed.",
    )
    rule = pruning.add_mutually_exclusive_group(required=True)
    rule.add_argument(
        "--before", metavar="DATE", help="trees last active before DATE (2026-01-31, or 30d ago)"
    )
    rule.add_argument(
        "--keep-last", type=int, metavar="N", help="all but the N most recently active trees"
    )
    rule.add_argument("--entity", metavar="ID", help="one root entity's tree")
    pruning.add_argument(
        "--archive",
        metavar="FILE.jsonl",
        help="write the removed trees here first, turn by turn (a JSONL loom, or an existing "
        "loom other than this one); after a prune cut short, run it again to complete it",
    )
    pruning.add_argument(
        "--dry-run", action="store_true", help="say what would be removed; remove nothing"
    )
    pruning.add_argument(
        "--memories",
        action="store_true",
        help="also forget the memories the removed sessions wrote (those whose latest "
        "revision names one of them); kept otherwise",
    )
    pruning.add_argument(
        "--idle-s",
        type=float,
        default=60.0,
        metavar="S",
        help="leave trees written to in the last S seconds (another process may be casting "
        "on them; default 60)",
    )
    pruning.add_argument("--json", action="store_true", help="print JSON")
    statistics = commands.add_parser(
        "stats",
        help="entities, turns, bytes per table, oldest and newest activity",
        description="Say how big the loom is: entities, turns, bytes per table, and its "
        "oldest and newest activity.",
    )
    statistics.add_argument("--json", action="store_true", help="print JSON")
    parser: argparse.ArgumentParser = loom
    return parser


def loom_location(text: str) -> Path | str:
    """A loom file's path, or a ``postgresql://`` URL kept as it was typed (a path
    would fold its ``//``)."""
    if text.startswith(POSTGRES_SCHEMES):
        return text
    return Path(text)


MEMORY_HELP = """\
List, search, show and forget what a cantrip remembers (its [memory] store, kept in
its loom's database). TARGET is a spec file (.toml: its loom, and its embedder so
that a search can be semantic or hybrid) or a loom: an SQLite file or a
postgresql:// URL (text search only).

NAMESPACE is its parts joined by '/' (user/alice), or a JSON list of strings for
parts that hold a '/' (["user", "a/b"]).

Everything printed has its secrets redacted. forget takes every revision of what
it forgets; --dry-run says what it would forget first. exit codes: 0 success, 1 error
"""
"""What ``cantrip memory --help`` prints (plain text, for users)."""


def add_memory_parser(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """Add the ``memory`` command (with its subcommands) to a ``cantrip`` parser."""
    memory = subparsers.add_parser(
        "memory",
        parents=list(parents),
        help="list, search, show or forget what a cantrip remembers",
        description=MEMORY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    memory.add_argument(
        "target",
        metavar="TARGET",
        help="a spec file (.toml), a loom file (.db) or a postgresql:// URL",
    )
    commands = memory.add_subparsers(dest="memory_command", required=True, metavar="COMMAND")

    listing = commands.add_parser(
        "list",
        help="the namespaces, or the items under one",
        description="List the namespaces that hold items (under PREFIX); with --items, "
        "the items under PREFIX, newest first.",
    )
    listing.add_argument(
        "prefix", nargs="?", default="", metavar="PREFIX", help="only under this namespace"
    )
    listing.add_argument("--items", action="store_true", help="list items, not namespaces")
    listing.add_argument("--limit", type=int, default=100, help="at most N (default: 100)")
    listing.add_argument("--json", action="store_true", help="print JSON")

    search = commands.add_parser(
        "search",
        help="the items that best match a query",
        description="Search the items (under --prefix) for a query, best match first: by "
        "words, by meaning or both (hybrid, the default when the spec names an embedder).",
    )
    search.add_argument("query", metavar="QUERY", help="what to look for")
    search.add_argument("--prefix", default="", metavar="NAMESPACE", help="only under this")
    search.add_argument(
        "--mode",
        choices=("text", "semantic", "hybrid"),
        help="text, semantic or hybrid (semantic and hybrid need an embedder)",
    )
    search.add_argument("--limit", type=int, default=10, help="at most N (default: 10)")
    search.add_argument("--json", action="store_true", help="print JSON")

    show = commands.add_parser(
        "show",
        help="one item, its revisions and the turn that wrote it",
        description="Show an item: its value, metadata, every revision (newest first) and "
        "the turn that wrote it (its entity, intent and text), when the loom holds it.",
    )
    show.add_argument("namespace", metavar="NAMESPACE", help="the item's namespace")
    show.add_argument("key", metavar="KEY", help="the item's key")
    show.add_argument("--json", action="store_true", help="print JSON")

    forget = commands.add_parser(
        "forget",
        help="forget an item, or every item under a namespace",
        description="Forget KEY in NAMESPACE, or every item under NAMESPACE, each with every "
        "revision. An empty namespace is refused: forget will not forget everything.",
    )
    forget.add_argument("namespace", metavar="NAMESPACE", help="the namespace (not empty)")
    forget.add_argument("key", nargs="?", metavar="KEY", help="only this item")
    forget.add_argument(
        "--dry-run", action="store_true", help="say what would be forgotten; forget nothing"
    )
    forget.add_argument("--json", action="store_true", help="print JSON")
    parser: argparse.ArgumentParser = memory
    return parser


def add_eval_parser(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    evals = commands.add_parser(
        "eval",
        parents=parents,
        help="run an eval suite; 'eval compare A.json B.json'; 'eval add LOOM REF --suite S'",
        description=(
            "Run every case of a suite against a spec and score it. "
            "'cantrip eval compare A.json B.json' lists regressions and improvements between "
            "two reports; 'cantrip eval add LOOM REF --suite SUITE' turns a recorded cast "
            "into a regression case with its recording."
        ),
    )
    evals.add_argument("target", help="the suite file, or 'compare' or 'add'")
    evals.add_argument("more", nargs="*", help="compare: two JSON reports; add: LOOM and REF")
    evals.add_argument("--spec", type=Path, help="the spec to evaluate (instead of the suite's)")
    evals.add_argument("--concurrency", type=int, default=4, help="cases run at once (default 4)")
    evals.add_argument("--repeat", type=int, default=1, help="runs of each case (default 1)")
    evals.add_argument("--json", type=Path, metavar="FILE", help="write the JSON report here")
    evals.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML here")
    evals.add_argument("--loom", type=Path, metavar="FILE", help="record the casts in this loom")
    mode = evals.add_mutually_exclusive_group()
    mode.add_argument(
        "--record", type=Path, metavar="LOOM", help="keep every case's cast here, for --replay"
    )
    mode.add_argument(
        "--replay",
        nargs="?",
        const=SUITE_RECORDING,
        metavar="LOOM",
        help="answer the agent's model requests from this recording (default: the suite's "
        "'recording'); offline, no key needed",
    )
    evals.add_argument(
        "--max-cost-usd", type=float, metavar="X", help="stop starting cases once X USD is spent"
    )
    evals.add_argument("--suite", type=Path, help="add: the suite file to add the case to")
    evals.add_argument("--name", help="add: the new case's name")


def add_mcp_parser(commands: Any, parents: list[Any] | None = None) -> None:
    mcp = commands.add_parser(
        "mcp", parents=parents or [], help="serve the spec's cantrip as an MCP server (tool: cast)"
    )
    mcp.add_argument("spec", type=Path, help="a cantrip spec file (TOML)")
    mcp.add_argument("--http", action="store_true", help="streamable HTTP at /mcp instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="with --http; default: 127.0.0.1")
    mcp.add_argument(
        "--port", type=int, default=8000, help="with --http; default: 8000 (0: any free port)"
    )
    mcp.add_argument(
        "--token",
        help="with --http: require 'Authorization: Bearer TOKEN' (needed off loopback; "
        "default: $CANTRIP_MCP_TOKEN)",
    )
    mcp.add_argument(
        "--input-ttl",
        type=_positive_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="how long a pause is held for a 2026-07-28 client's next request before its "
        "call is cut off and its session let go of; default: 3600",
    )
    mcp.add_argument("--check", action="store_true", help="load the spec, report, and exit")
    mcp.add_argument("--log", type=Path, help="write a debug log to this file (never stdout)")


def _positive_seconds(text: str) -> float:
    """A number of seconds above zero (``--input-ttl``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return value
