"""Leases: the heartbeats that keep a worker's leases, and what happens when one is lost.

A worker holds each entity it runs under a fenced lease. Renewing them is a job of its
own -- a statement per few hundred of them, on a connection of its own, every third
of the lease -- and so is losing one: the loom refuses the run's writes from then on and the
run stops, so the next claim (any worker's) continues from what the loom holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from cantrip._redact import get_logger
from cantrip.distributed._outage import Outage, database_away
from cantrip.distributed._owned import Owned
from cantrip.distributed._renewal import heartbeat_on
from cantrip.loom._loom import Loom
from cantrip.loom._postgres_writes import lease_lost_message

log = get_logger("cantrip.worker")


async def heartbeats(
    runs: Mapping[str, Owned], *, url: str, worker_id: str, lease_s: float, loom: Loom
) -> None:
    """Renew every lease this worker holds (``runs``: the entities it runs now), every
    third of the lease, a few hundred per statement (``_renewal.FENCE_CHUNK``: each its
    own transaction, within PostgreSQL's lock table) on a connection of its own -- never
    queued behind the loom's writes. A renewal moves each run's local deadline to when it was
    *sent* plus the lease; a lease the database no longer holds stops its run at once;
    one that cannot be renewed (the database is away) stops its run at its deadline."""
    import psycopg

    limiter = trio.CapacityLimiter(1)
    outage = Outage("worker heartbeat", log)
    conn: psycopg.Connection[Any] | None = None
    try:
        while True:
            await trio.sleep(lease_s / 3)
            owned = [o for o in runs.values() if not o.releasing and o.lost is None]
            if not owned:
                continue
            sent = trio.current_time()
            with database_away() as away:
                if conn is None:
                    conn = await trio.to_thread.run_sync(
                        lambda: psycopg.connect(url, autocommit=True, connect_timeout=5),
                        limiter=limiter,
                    )
                renewed = await trio.to_thread.run_sync(
                    heartbeat_on,
                    conn,
                    worker_id,
                    [o.claim.fence for o in owned],
                    lease_s,
                    limiter=limiter,
                )
            if away.exc is not None:
                outage.failed(away.exc)  # the next tick tries again; deadlines stop the runs
                if conn is not None:
                    bad, conn = conn, None
                    await trio.to_thread.run_sync(bad.close, limiter=limiter)
                continue
            outage.ok()
            for o in owned:
                if runs.get(o.claim.entity_id) is not o or o.run.cancel_called:
                    continue  # ended, or being stopped, while the beat was out
                if o.claim.entity_id in renewed:
                    cancel = renewed[o.claim.entity_id]
                    if cancel is None:  # another transaction held the row: renewed next beat
                        continue
                    until = sent + lease_s
                    o.run.deadline = max(o.run.deadline, until)
                    loom.renew(o.claim.fence.lease_entity, until)
                    if cancel and not o.cancelled:
                        o.cancel(cancel)  # the poll fallback of NOTIFY cantrip_cancel
                elif not o.releasing:  # given up on purpose by finish is not lost
                    lose(o, loom, lease_lost_message(o.claim.fence))
    finally:
        if conn is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(conn.close)


def lose(owned: Owned, loom: Loom, why: str) -> None:
    """The lease is gone: refuse the run's writes here and stop it (said once)."""
    if owned.lost is None:
        owned.lost = why
        log.warning("%s: lease lost; stopping it here", owned.claim.entity_id)
    loom.lose(owned.claim.fence, why)
    owned.run.cancel()
