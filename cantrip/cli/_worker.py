"""``cantrip worker --db URL`` and ``cantrip cast --db URL``: the distributed commands."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from cantrip._errors import CantripError
from cantrip._redact import redact
from cantrip.cli._exit import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_PAUSED,
    exit_for,
)
from cantrip.cli._exit import fail as _fail

Ended = tuple[str, int, dict[str, Any]]
"""How a queued cast ended: its state, the last work item, and its outcome."""


def _quiet_pool_log() -> None:
    """The commands' own choice for their stderr: psycopg's pool logs each connection
    it discards or fails to open as a warning; the commands keep its errors only.
    Set here, by the process's owner -- importing the library changes no logger, so
    an application that embeds a :class:`~cantrip.Worker` keeps the pool's warnings."""
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


def run_worker(args: argparse.Namespace) -> int:
    """Run until SIGTERM (or SIGINT), then drain (:meth:`Worker.drain`): claim nothing
    more, let each running cast reach its next turn boundary, and hand its lease back
    unrecorded, so another worker resumes it at no attempt and no crash. At the end of
    ``--drain-s``, or at a second signal, what still runs is handed back at once."""
    _quiet_pool_log()
    from cantrip.cli._process import command_gc
    from cantrip.distributed._worker import Worker

    if args.dead_letters:
        return _list_dead_letters(args.db)
    if args.max_attempts < 1:
        return _fail(f"--max-attempts must be at least 1, not {args.max_attempts}")
    if not args.drain_s >= 0:
        return _fail(f"--drain-s must be 0 or more seconds, not {args.drain_s:g}")
    try:
        collector = command_gc(args.gc_young)
    except ValueError as exc:
        return _fail(str(exc))
    worker = Worker(
        args.db,
        concurrency=args.concurrency,
        lease_s=args.lease,
        max_attempts=args.max_attempts,
        drain_s=args.drain_s,
        worker_id=args.worker_id,
    )

    def say(text: str) -> None:
        print(f"cantrip: {text}", file=sys.stderr, flush=True)

    async def stop_on(signals: Any) -> None:
        """The first signal drains the worker, the next hands back what still runs."""
        async for signum in signals:
            name = signal.Signals(signum).name
            if not worker.draining:
                say(
                    f"{name}: draining: no more claims; running casts stop at their next "
                    f"turn boundary and are handed back (grace {args.drain_s:g} s; "
                    f"{name} again hands back at once)"
                )
                worker.drain()
            else:
                say(f"{name} again: handing back at once")
                worker.hand_back()

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def running(*, task_status: trio.TaskStatus[str]) -> None:
                    await worker.run(task_status=task_status)
                    nursery.cancel_scope.cancel()  # drained: stop listening for signals

                nursery.start_soon(stop_on, signals)
                worker_id = await nursery.start(running)
                took = (
                    f"; took back {worker.reclaimed} cast(s) of its identity"
                    if worker.reclaimed
                    else ""
                )
                say(f"worker {worker_id} ready{took}")
        say(f"worker {worker_id} stopped; {worker.handed_back} running casts handed back")

    try:
        with collector:  # as serve: many entities at once, in a process of its own
            trio.run(run)
    except CantripError as exc:
        return _fail(str(exc))
    return 0


def _list_dead_letters(url: str) -> int:
    """``cantrip worker --db URL --dead-letters``: the casts no worker could finish within
    the attempt limit, one JSON object a line (redacted), oldest first."""
    from cantrip.distributed._dispatcher import Dispatcher

    try:
        dispatcher = Dispatcher(url)
    except CantripError as exc:
        return _fail(str(exc))
    try:
        for item in dispatcher.dead_letters():
            print(redact(json.dumps(item)))
    finally:
        dispatcher.close()
    return 0


def cast_on_db(args: argparse.Namespace) -> int:
    """Enqueue the spec's cast, wait for a worker to finish it, print like ``cast``."""
    _quiet_pool_log()
    from cantrip._text import require_cli_intent

    intent = args.intent if args.intent is not None else sys.stdin.read().strip()
    require_cli_intent(intent)
    opened = _queued_spell(args)
    if isinstance(opened, int):
        return opened
    spell, dispatcher = opened
    rule = _standing_decision(args)

    def no_worker(waited: float) -> None:
        print(
            f"cantrip: no worker has taken work {work_id} after {waited:.0f} s -- none seems "
            "to be running on this database; start one with: cantrip worker --db URL "
            "(this command keeps waiting; Ctrl-C cancels the cast)",
            file=sys.stderr,
            flush=True,
        )

    work_id = 0

    def run() -> Ended | int:
        nonlocal work_id
        work_id, entity_id = dispatcher.submit(spell, intent)
        print(f"cantrip: queued work {work_id} for {entity_id}", file=sys.stderr, flush=True)
        try:
            work_id, state, outcome = _waited(dispatcher, work_id, entity_id, rule, no_worker)
        except KeyboardInterrupt:
            dispatcher.cancel(entity_id)
            print("cantrip: interrupted; the cast is cancelled", file=sys.stderr)
            return EXIT_INTERRUPTED
        return state, work_id, outcome

    return _on_dispatcher(args, dispatcher, run)


def casts_on_db(args: argparse.Namespace) -> int:
    """``cast --db --intents FILE``: queue one cast per line in one commit
    (``Dispatcher.submit_many``), wait for each in turn, print each like ``cast --db``
    (with ``--json`` one object per line), in the file's order. The exit code is the
    first cast's that did not end 0, else 0."""
    _quiet_pool_log()
    from cantrip._text import require_cli_intent

    try:
        text = (
            sys.stdin.read()
            if args.intents == "-"
            else Path(args.intents).read_text(encoding="utf-8")
        )
    except OSError as exc:
        return _fail(f"cannot read {args.intents}: {exc.strerror or exc}")
    intents = [line.strip() for line in text.splitlines() if line.strip()]
    if not intents:
        return _fail(f"{args.intents}: no intents (one per line)")
    for intent in intents:
        require_cli_intent(intent)
    opened = _queued_spell(args)
    if isinstance(opened, int):
        return opened
    spell, dispatcher = opened
    rule = _standing_decision(args)
    try:
        queued = dispatcher.submit_many(spell, intents)
        print(f"cantrip: queued {len(queued)} casts in one commit", file=sys.stderr, flush=True)
        code = 0
        for index, (work_id, entity_id) in enumerate(queued):
            try:
                work_id, state, outcome = _waited(dispatcher, work_id, entity_id, rule)
            except KeyboardInterrupt:
                for _, waiting in queued[index:]:
                    dispatcher.cancel(waiting)
                print("cantrip: interrupted; the casts not yet ended are cancelled",
                      file=sys.stderr)  # fmt: skip
                return EXIT_INTERRUPTED
            ended = _report(args, state, work_id, outcome)
            code = code or ended
        return code
    except CantripError as exc:
        return _fail(str(exc))
    finally:
        dispatcher.close()


def _queued_spell(args: argparse.Namespace) -> tuple[dict[str, Any], Any] | int:
    """The spec as the workers' queue takes it (refused if it holds a literal
    credential) and a dispatcher on ``--db``; or the exit code of a one-line failure."""
    from cantrip.distributed._dispatcher import Dispatcher
    from cantrip.distributed._spell_secrets import check_queued_spell
    from cantrip.distributed._spells import spell_from_spec

    try:
        spell = spell_from_spec(args.spec)
        check_queued_spell(spell)
        return spell, Dispatcher(args.db)
    except CantripError as exc:
        return _fail(str(exc))


def _waited(
    dispatcher: Any,
    work_id: int,
    entity_id: str,
    rule: Any,
    on_unclaimed: Callable[[float], None] | None = None,
) -> tuple[int, str, dict[str, Any]]:
    """Wait for the work to end; with ``--approve-all``/``--deny-all`` (``rule``) answer
    each pause as it comes and go on. (The last work id, its state, its outcome.)"""
    state, outcome = dispatcher.wait(work_id, on_unclaimed=on_unclaimed)
    while state == "paused" and rule is not None:
        for pause in outcome.get("pending") or []:
            work_id = dispatcher.answer(entity_id, pause["pause_id"], rule)
        state, outcome = dispatcher.wait(work_id)
    return work_id, state, outcome


def _on_dispatcher(
    args: argparse.Namespace, dispatcher: Any, run: Callable[[], Ended | int]
) -> int:
    """Run a ``--db`` command's part that talks to the queue, then report how the work
    ended like ``cast``. A CantripError is one line; the dispatcher is closed either
    way; ``run`` returns an exit code itself when it ends early (interrupted, refused)."""
    try:
        ended = run()
    except CantripError as exc:
        return _fail(str(exc))
    finally:
        dispatcher.close()
    return ended if isinstance(ended, int) else _report(args, *ended)


def _standing_decision(args: argparse.Namespace) -> Any:
    """``--approve-all`` / ``--deny-all`` as the decision every pause gets (None: ask)."""
    from cantrip._approval import Decision

    if getattr(args, "approve_all", False):
        return Decision.approve()
    if getattr(args, "deny_all", False):
        return Decision.deny("denied by --deny-all")
    return None


def answer_on_db(args: argparse.Namespace) -> int:
    """``cantrip answer --db URL ENTITY PAUSE``: answer a paused cast from anywhere, wait
    for a worker to carry the answer out, print the cast's result like ``cast --db``."""
    _quiet_pool_log()
    from cantrip._approval import Decision, PauseError
    from cantrip.distributed._dispatcher import Dispatcher

    if args.answer is not None:
        decision = Decision.answer(args.answer)
    elif args.deny is not None:
        decision = Decision.deny(args.deny or None)
    else:
        decision = Decision.approve()
    try:
        dispatcher = Dispatcher(args.db)
    except CantripError as exc:
        return _fail(str(exc))

    def run() -> Ended | int:
        try:
            work_id = dispatcher.answer(args.entity_id, args.pause_id, decision)
        except PauseError as exc:
            return _fail(str(exc))
        print(f"cantrip: queued work {work_id} to carry out the answer", file=sys.stderr,
              flush=True)  # fmt: skip
        try:
            state, outcome = dispatcher.wait(work_id)
        except KeyboardInterrupt:
            print("cantrip: interrupted; the answer is recorded and a worker carries it out",
                  file=sys.stderr)  # fmt: skip
            return EXIT_INTERRUPTED
        return state, work_id, outcome

    return _on_dispatcher(args, dispatcher, run)


def _report(args: argparse.Namespace, state: str, work_id: int, outcome: dict[str, Any]) -> int:
    """Print how the work ended (like ``cast``) and return the exit code."""
    if args.json:
        from cantrip.cli._output import print_cast_json
        from cantrip.loom._postgres_connection import safe_url

        extra = {"state": state, "work_id": work_id}
        print_cast_json(outcome, loom=safe_url(args.db), extra=extra)
    elif state in ("failed", "dead"):
        print(f"cantrip: {redact(str(outcome.get('error')))}", file=sys.stderr)
    elif state == "paused":
        _print_pending(outcome)
    elif outcome.get("terminated"):
        result = outcome.get("result")
        print(redact(result if isinstance(result, str) else json.dumps(result)))
    if state == "paused":
        return EXIT_PAUSED
    if state in ("failed", "dead"):
        return EXIT_ERROR
    if state == "cancelled":
        return EXIT_INTERRUPTED
    return exit_for(bool(outcome.get("terminated")), outcome.get("reason"))


def _print_pending(outcome: dict[str, Any]) -> None:
    """What the paused cast waits for, and the command that answers it (the database
    URL is left for the user to fill in: it may hold a password)."""
    entity_id = outcome.get("entity_id")
    for pause in outcome.get("pending") or []:
        what = pause.get("question") or json.dumps(pause.get("args") or {}, default=str)
        how = "--answer TEXT | --deny" if pause.get("kind") == "question" else "--approve | --deny"
        print(
            redact(
                f"cantrip: paused; {pause.get('pause_id')} waits for a human: "
                f"{pause.get('gate')} {what}\n"
                f"cantrip: answer it with: cantrip answer --db URL {entity_id} "
                f"{pause.get('pause_id')} {how}"
            ),
            file=sys.stderr,
        )


def serve_on_db(
    args: argparse.Namespace,
    guard: Any,
    options: Any,
    collector: contextlib.AbstractContextManager[None],
) -> int:
    """``cantrip serve SPEC --db URL``: a stateless HTTP replica; prompts go to the workers.

    The spec is built once here to check it and describe it on ``/health``. A circle
    that pauses for a human is served like in-process: the pause waits in the
    database, answered through ``/sessions/{id}/pending/{pause_id}``."""
    _quiet_pool_log()
    from cantrip.distributed._spell_secrets import check_queued_spell
    from cantrip.distributed._spells import spell_from_spec
    from cantrip.distributed._work import BUDGETS_KEY
    from cantrip.loom._loom import Loom
    from cantrip.protocols.sessions._budgets import ServeBudgets

    budgets = ServeBudgets.parse(args.session_budget, args.token_budget)  # checked already
    if budgets.token:
        return _fail(
            "--token-budget is not kept by serve --db (the workers each see their own "
            "casts, not the token's); use --session-budget"
        )
    try:
        spell = spell_from_spec(args.spec)
        if budgets.session:  # the workers charge each session's history against them
            spell = {**spell, BUDGETS_KEY: dict(budgets.session)}
        check_queued_spell(spell)
        # memory lives in the loom's database, so a spec with [memory] is built over the
        # replica's (what its /memory routes and the workers use); others need none
        has_memory = isinstance(spell.get("spec"), dict) and "memory" in spell["spec"]
        loom = Loom.open(args.db) if has_memory else Loom()
    except CantripError as exc:
        return _fail(str(exc))
    try:
        return _serve_built(args, spell, loom, guard, options, collector)
    finally:
        loom.close()


def acp_on_db(args: argparse.Namespace) -> int:
    """``cantrip acp SPEC --db URL``: ACP on stdio over PostgreSQL sessions (the backend
    ``serve --db`` uses); the prompts go to the workers. The spec is built here to check
    it and for what ACP shows of it (the model's context window)."""
    _quiet_pool_log()
    from cantrip.distributed._spell_secrets import check_queued_spell
    from cantrip.distributed._spells import build_spell, spell_from_spec
    from cantrip.loom._loom import Loom
    from cantrip.protocols import serve_stdio
    from cantrip.protocols.sessions import PostgresBackend

    try:
        spell = spell_from_spec(args.spec)
        check_queued_spell(spell)
        cantrip = build_spell(spell, Loom())
    except CantripError as exc:
        return _fail(str(exc))
    if args.check:
        gates = ", ".join(cantrip.circle.gate_names)
        print(f"ok: {args.spec} loads (gates {gates}; acp --db)", file=sys.stderr)
        return 0

    async def serve() -> None:
        async with PostgresBackend.open(args.db, spell) as backend:
            await serve_stdio(cantrip, protocol=args.protocol, backend=backend)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)
    return 0


def _serve_built(
    args: argparse.Namespace,
    spell: dict[str, Any],
    loom: Any,
    guard: Any,
    options: Any,
    collector: contextlib.AbstractContextManager[None],
) -> int:
    from cantrip.cli._serve import serve_until_signal
    from cantrip.distributed._spells import build_spell
    from cantrip.protocols.http._serve import serve_http_db

    try:
        cantrip = build_spell(spell, loom)
    except CantripError as exc:
        return _fail(str(exc))
    if args.check:
        gates = ", ".join(cantrip.circle.gate_names)
        print(f"ok: {args.spec} loads (gates {gates}; serve --db)", file=sys.stderr)
        return 0

    start = functools.partial(
        serve_http_db,
        spell,
        cantrip,
        args.db,
        args.host,
        args.port,
        options=options,
        guard=guard,
        read_timeout_s=args.client_timeout,
    )
    try:
        background = None
        if args.retain_days is not None:
            from cantrip.loom._retention import keep_retained

            background = functools.partial(keep_retained, args.db, args.retain_days)
        with collector:  # entered once the spec is loaded, as in-process serve does
            failure = serve_until_signal(
                start, host=args.host, port=args.port, spec=args.spec, draining="draining",
                note=" (db mode)", background=background,
            )  # fmt: skip
    except CantripError as exc:
        failure = str(exc)
    return 0 if failure is None else _fail(failure)
