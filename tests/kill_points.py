"""``cantrip worker`` that kills itself (SIGKILL) at one point of a turn, once.

``tests/test_worker_kill_points.py`` runs it as the worker process: ``KILL_POINT`` names
where, ``KILL_SEQUENCE`` the turn (its sequence), and ``KILL_MARK`` a file made just
before the kill, so that a worker started again with the same settings runs on
unharmed. The points, in a turn's order:

* ``before_start`` -- the batch that journals the call's start is about to be sent
  (the utterance goes with it): nothing of the turn is durable;
* ``after_start`` -- that batch committed: the gate has not run;
* ``in_gate`` -- the gate made its effect (the ``chaos_effects`` row) and has not
  returned;
* ``before_turn`` -- the gate returned: the batch with the turn (and its result) is
  about to be sent;
* ``after_turn`` -- the turn committed.

Nothing in cantrip is changed here but where the process dies: the writes are the
real ones (``PostgresStore.write_batch``) and the kill is the kernel's.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

POINT = os.environ.get("KILL_POINT", "")
SEQUENCE = int(os.environ.get("KILL_SEQUENCE", "2"))
MARK = Path(os.environ.get("KILL_MARK", "/nonexistent/mark"))


def _die() -> None:
    if MARK.exists():
        return
    MARK.touch()
    os.kill(os.getpid(), signal.SIGKILL)


def _starts(batch: Any) -> bool:
    """Whether the batch journals a call's start: a call's own row without a result, or
    the utterance's row, which carries its first call's start (``cantrip._journal``)."""
    return any(
        kind == "journal"
        and p[1] == SEQUENCE
        and ((p[2] >= 0 and p[5] is None) or (p[2] < 0 and p[5] is not None))
        for kind, p, _ in batch
    )


def _turns(batch: Any) -> bool:
    return any(kind == "turn" and p.sequence == SEQUENCE for kind, p, _ in batch)


def install() -> None:
    import distributed_workload

    from cantrip.loom._postgres import PostgresStore

    write_batch = PostgresStore.write_batch

    def killing_write_batch(self: PostgresStore, batch: Any) -> Any:
        if (POINT == "before_start" and _starts(batch)) or (
            POINT == "before_turn" and _turns(batch)
        ):
            _die()
        refused = write_batch(self, batch)
        if (POINT == "after_start" and _starts(batch)) or (POINT == "after_turn" and _turns(batch)):
            _die()
        return refused

    PostgresStore.write_batch = killing_write_batch  # type: ignore[method-assign]
    if POINT == "in_gate":
        db = distributed_workload._db

        class Dying:
            def execute(self, sql: str, params: Any) -> Any:
                done = db().execute(sql, params)
                if params[1] == SEQUENCE:  # the effect of this turn's call is made
                    _die()
                return done

        distributed_workload._db = lambda: Dying()  # type: ignore[assignment]


if __name__ == "__main__":
    install()
    from cantrip.cli import main

    sys.argv = ["cantrip", *sys.argv[1:]]
    sys.exit(main())
