"""Ownership of an entity by one worker: the fence every append carries.

A worker that claims an entity holds a lease on it with a fencing *epoch*
(:mod:`cantrip.distributed`). Every loom write it makes for that entity -- and
for the children the entity spawns in the same worker -- carries the
:class:`Fence`; the store writes only if the lease is still this worker's, at
this epoch, and unexpired, in the same transaction as the write. A worker that
was paused or partitioned past its lease can therefore never append again.
"""

from __future__ import annotations

from typing import Any

import attrs

from cantrip._errors import CantripError


class LeaseLostError(CantripError):
    """A write was refused: this worker no longer holds the entity's lease.

    The worker must stop running the entity; another worker resumes it from
    the loom. Nothing the refused write carried is in the loom."""


@attrs.frozen
class Fence:
    """The lease a write is made under: whose entity, which worker, which epoch."""

    lease_entity: str
    """The top-level entity the lease is on (children run under their root's lease)."""
    owner: str
    """The worker's id."""
    epoch: int
    """Incremented by every claim: a newer owner's epoch is always larger."""


PendingOp = tuple[str, Any, Fence | None]
"""A queued write of a deferred store: ("entity" | "turn" | "reward" | "journal",
payload, fence) -- queued by the loom, made by the store (``PostgresStore.write_batch``)."""
