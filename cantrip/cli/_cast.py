"""``cantrip cast`` and ``cantrip invoke``: an entity run on this terminal.

``cast`` runs one intent and prints the result on stdout (progress on stderr when
it is a terminal); ``invoke`` keeps one entity for a session of intents typed one
a line. Both decide up front who answers the circle's pauses (:func:`_pause_handler`).
(``cast --db`` enqueues on the workers instead: :mod:`cantrip.cli._worker`.)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from cantrip._cantrip import Cantrip
from cantrip._errors import CantripError
from cantrip._redact import redact
from cantrip.cli._exit import EXIT_INTERRUPTED, exit_for, fail
from cantrip.cli._spec_file import check_spec, load_cantrip, loom_file


def run_cast(args: argparse.Namespace) -> int:
    from cantrip._text import check_text, decode_input, require_cli_intent
    from cantrip.protocols.terminal._progress import (
        Progress,
        cast_with_progress,
        describe_llm,
        wants_progress,
    )

    if args.check:
        spell = load_cantrip(args.spec, args.loom)
        try:
            return check_spec(args.spec, spell)
        finally:
            spell.loom.close()
    if args.intent is None and sys.stdin.isatty():
        print("cantrip: type the intent, then Ctrl-D", file=sys.stderr)
    if args.intent is not None:
        intent = check_text(args.intent, "the intent argument")
    else:
        intent = decode_input(sys.stdin.buffer.read(), "the intent on stdin").strip()
    require_cli_intent(intent)
    spell = load_cantrip(args.spec, args.loom)
    progress = Progress(enabled=wants_progress(sys.stderr, args.quiet), llm=describe_llm(spell.llm))
    try:
        on_pause = _pause_handler(args, spell, args.intent is not None and sys.stdin.isatty())
        if on_pause == "ask":
            from cantrip.protocols.terminal._human import TerminalHuman
            from cantrip.protocols.terminal._progress import stderr_console

            on_pause = TerminalHuman(stderr_console(), _stdin_line, progress.held)
        outcome, interrupted = trio.run(cast_with_progress, spell, intent, progress, on_pause)
    finally:
        spell.loom.close()
    loom_path = loom_file(spell)
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
    return exit_for(outcome.terminated, outcome.reason)


async def _stdin_line() -> str | None:
    """One line from stdin, read in a worker thread (a blocking read the run can abandon)."""
    line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return line.rstrip("\n") if line else None


def run_invoke(args: argparse.Namespace) -> int:
    from cantrip.protocols.terminal._progress import (
        Invocation,
        Progress,
        describe_llm,
        print_out,
        stderr_console,
        wants_progress,
    )

    spell = load_cantrip(args.spec, args.loom)
    try:
        if args.resume is not None:
            if loom_file(spell) is None:
                return fail(
                    "--resume needs a loom file: add [loom] path = ... to the spec (or --loom)"
                )
            record = spell.loom.entities.get(args.resume)
            if record is None or record.parent_entity_id is not None:
                return fail(f"no entity {args.resume!r} in {loom_file(spell)}")
        console = stderr_console()
        try:
            on_pause = _pause_handler(args, spell, sys.stdin.isatty())
        except CantripError as exc:
            return fail(str(exc))
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


def _pause_handler(args: argparse.Namespace, spell: Cantrip, interactive: bool) -> Any:
    """Who answers the circle's pauses: a standing rule, the terminal, or nobody
    (then the command refuses to start rather than wait on a human who is not there)."""
    from cantrip.protocols.terminal._human import standing_rule

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
