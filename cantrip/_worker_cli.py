"""``cantrip worker --db URL`` and ``cantrip cast --db URL``: the distributed commands."""

from __future__ import annotations

import argparse
import json
import signal
import sys

import trio

from cantrip._errors import CantripError
from cantrip._redact import redact

EXIT_TERMINATED, EXIT_ERROR, EXIT_TRUNCATED, EXIT_INTERRUPTED = 0, 1, 2, 130


def run_worker(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM; casts in flight are left to the next worker (their
    leases expire) -- the loom and the gate journal hold everything they did."""
    from cantrip._worker import Worker

    worker = Worker(args.db, concurrency=args.concurrency, lease_s=args.lease)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                worker_id = await nursery.start(worker.run)
                print(f"cantrip: worker {worker_id} ready", file=sys.stderr, flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(run)
    except CantripError as exc:
        print(f"cantrip: {redact(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def cast_on_db(args: argparse.Namespace) -> int:
    """Enqueue the spec's cast, wait for a worker to finish it, print like ``cast``."""
    from cantrip._worker import Dispatcher, spell_from_spec

    intent = args.intent if args.intent is not None else sys.stdin.read().strip()
    try:
        spell = spell_from_spec(args.spec)
        dispatcher = Dispatcher(args.db)
    except CantripError as exc:
        print(f"cantrip: {redact(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    try:
        work_id, entity_id = dispatcher.submit(spell, intent)
        print(f"cantrip: queued work {work_id} for {entity_id}", file=sys.stderr, flush=True)
        try:
            state, outcome = dispatcher.wait(work_id)
        except KeyboardInterrupt:
            dispatcher.cancel(entity_id)
            print("cantrip: interrupted; the cast is cancelled", file=sys.stderr)
            return EXIT_INTERRUPTED
    except CantripError as exc:
        print(f"cantrip: {redact(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        dispatcher.close()
    if args.json:
        print(json.dumps({"state": state, "work_id": work_id, **outcome}, default=str))
    elif state == "failed":
        print(f"cantrip: {redact(str(outcome.get('error')))}", file=sys.stderr)
    elif outcome.get("terminated"):
        result = outcome.get("result")
        print(redact(result if isinstance(result, str) else json.dumps(result)))
    if state == "failed":
        return EXIT_ERROR
    if state == "cancelled":
        return EXIT_INTERRUPTED
    return EXIT_TERMINATED if outcome.get("terminated") else EXIT_TRUNCATED
