"""How a ``serve --db`` replica's waiters look at their prompts' work: many looks, one read.

A request waiting for its prompt's result looks at the prompt's work item when it
starts waiting, whenever a notification about its entity wakes it (the queue's NOTIFY
says only "something happened to this entity": its own enqueue, a claim, an end), and
every ``poll_s`` in case one was missed. Under many prompts at once that was a
transaction per look per waiter -- as many reads as prompts, several times over
(issue 46). :class:`ProgressLooks` gathers them by the rule the prompts' writes follow
(:class:`~cantrip.loom._group_commit.GroupCommit`): one read in flight, every look
asked for meanwhile goes into the next, no timer -- a look alone goes at once. A look
is read after it was asked for, so a waiter woken by a notification sees what the
notification told of.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from cantrip.loom._group_commit import GroupCommit
from cantrip.protocols.sessions._backend import SessionError
from cantrip.protocols.sessions._rows import DbSessions, Progress

MAX_LOOKS_PER_READ = 500
"""The most work items one read looks at."""

RunDb = Callable[[Callable[[Sequence[int]], dict[int, Progress]], Sequence[int]], Awaitable[Any]]
"""The backend's way to run a blocking database call (its thread, limiter and outage
bookkeeping; a failure as a :class:`SessionError`)."""


@attrs.define
class _Look:
    """A look asked for, and then what it saw (None: no such work item)."""

    work_id: int
    progress: Progress | None = None
    error: Exception | None = None


class ProgressLooks:
    """The looks a replica's waiters take at their work, a read per batch (see the
    module docstring)."""

    def __init__(
        self, sessions: DbSessions, run_db: RunDb, *, max_batch: int = MAX_LOOKS_PER_READ
    ) -> None:
        self._sessions = sessions
        self._run_db = run_db
        self._looks: GroupCommit[_Look] = GroupCommit(self._read, max_batch=max_batch)
        self.looked = 0
        """Looks answered so far (for tests and figures)."""

    @property
    def reads(self) -> int:
        """Reads made so far (each one transaction)."""
        return self._looks.batches

    async def progress(self, work_id: int) -> Progress | None:
        """The work item's progress, read after this call began (None: no such item);
        a failed read as the backend's :class:`SessionError`."""
        look = _Look(work_id)
        ticket = self._looks.queue(look)
        try:
            await self._looks.wait(ticket)
        finally:
            self._looks.withdraw(ticket)  # (a no-op once it was taken into a read)
        self.looked += 1
        if isinstance(look.error, SessionError):  # shared by the batch: each its own
            raise SessionError(look.error.kind, look.error.message) from None
        if look.error is not None:
            raise look.error
        return look.progress

    async def _read(self, batch: list[_Look]) -> None:
        """Read a batch (the group's writer), shielded: it holds other waiters' looks."""
        with trio.CancelScope(shield=True):
            try:
                found = await self._run_db(
                    self._sessions.progress_of, sorted({look.work_id for look in batch})
                )
            except Exception as exc:  # noqa: BLE001 -- each waiter hears it
                for look in batch:
                    look.error = exc
                return
        for look in batch:
            look.progress = found.get(look.work_id)
