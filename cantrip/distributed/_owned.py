"""The state a worker keeps about one entity it runs now, shared by the worker's rooms.

The claim loop makes it, the heartbeats renew and lose its lease, the mailbox wakes
it, execution fills in its entity: each of those modules reads and writes this one
record, so it lives below all of them.
"""

from __future__ import annotations

import attrs
import trio

from cantrip._core import Entity
from cantrip.distributed._work import Claim
from cantrip.loom._model import EntityRecord, Turn

Look = tuple[list[tuple[int, str]] | None, EntityRecord | None, Turn | None]
"""What a cast looks up in the database before it begins: the messages to its work (None:
the worker reads none), its entity's record and latest turn."""


@attrs.define
class Owned:
    """An entity this worker runs now."""

    claim: Claim
    run: trio.CancelScope
    """The run's scope; its deadline is the lease's local deadline (moved by each
    renewal): a lease that runs out stops the run here, whatever the heartbeat is doing."""
    entity: Entity | None = None
    cancelled: bool = False
    releasing: bool = False
    """Set just before ``finish`` releases the lease: from then on a heartbeat that finds
    the lease gone is not a loss (finish itself reports a lease lost before it)."""
    lost: str | None = None
    """Why the lease is gone (said once, by whoever found out first)."""
    poke: trio.Event = attrs.Factory(trio.Event)
    """Set when NOTIFY says something about this entity (an answer to a live pause)."""
    cancel_reason: str = "cancelled"
    mail: trio.Event = attrs.Factory(trio.Event)
    """Set when NOTIFY says a message for this entity's cast arrived (or the worker's
    poll finds one newer than ``mail_after``: a missed notification)."""
    mail_after: int = 0
    """The id of the last message to this cast the mailbox has read."""
    first_mail: list[tuple[int, str]] | None = None
    """The messages to this work read with the entity's refresh (the mailbox's first
    read, made in that thread hop), until the mailbox takes them."""
    looked: Look | None = None
    """The entity's refresh and the mailbox's first read, made for it with other casts
    claimed together in one thread hop (``Worker._look``), until the cast takes them."""
    looking: trio.Event | None = None
    """Set when that hop ended (None: no hop looks for this cast; it looks itself)."""
    casting: trio.Event = attrs.Factory(trio.Event)
    """Set as the cast is about to begin (``delivered`` is known then)."""
    delivered: int = 0
    """Messages to this work that the loom already shows joined a turn (an earlier
    attempt's): the first ``delivered`` are not handed to the cast again."""
    began: str | None = None
    """The entity's latest turn as the cast began (a turn after it: the cast got on)."""
    quarantine: trio.Event | None = None
    """Set (by ``Worker._innocent``) once this suspect cast, run alone, recorded
    a turn or ended: the worker claims other work again."""
    handing_back: bool = False
    """The worker is stopping: the cast stops at its next turn boundary (or sooner, if
    ``cut``) and the lease is handed back, unless the cast ends first."""
    spell_key: str | None = None
    """The claim's spell as the worker's cache key (made once: ``Execution``)."""
    cut: bool = False
    """Cut off now (a second signal, or the grace period's end): the lease is given up
    here first, so nothing more of the run is recorded."""

    def cancel(self, reason: str = "cancelled") -> None:
        self.cancelled, self.cancel_reason = True, reason
        if self.entity is not None:
            self.entity.cancel(reason)
