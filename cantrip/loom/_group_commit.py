"""Group commit: many callers' writes share one commit, without anyone waiting on a timer.

A commit costs the database an fsync whatever it holds, so writes made at the same time
by many tasks (the entities of a worker, the prompts arriving at a ``serve --db``
replica) are cheapest written together. The rule, the loom's since issue 17 and the
prompts' since issue 46.1: **one batch is written at a time; whatever is queued while it
is written goes into the next one.** A caller whose item is not written yet either waits
for the batch in flight or, if none is, writes everything queued so far itself (it is
the batch's *writer*). Under no load a write goes at once, alone; under load batches
grow by themselves to what arrives during one commit -- no fixed delay, no background
task. ``max_batch`` bounds a batch (a writer whose item did not fit writes the next).

This module holds only that rule. What a batch is written with -- and what a write that
failed means for its caller -- is the ``write`` callback's: it is called with the items
in queue order and returns when they are written (committed, or failed) -- shielded
from cancellation from its first checkpoint on, since the batch holds other callers'
items; an exception it raises reaches the batch's writer only (every other caller
re-checks what it needs once :meth:`GroupCommit.wait` returns). A caller that stops
waiting (cancelled) while its item is still queued can :meth:`~GroupCommit.withdraw` it:
it is never written. Once taken into a batch an item stays in it -- the batch holds
other callers' items too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, ValuesView
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class GroupCommit(Generic[T]):
    """Items queued by many tasks, written a batch at a time (see the module docstring)."""

    def __init__(
        self, write: Callable[[list[T]], Awaitable[None]], *, max_batch: int | None = None
    ) -> None:
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._write = write
        self.max_batch = max_batch
        self._queue: OrderedDict[int, T] = OrderedDict()
        """Items not taken into a batch yet, by ticket, in queue order."""
        self._next = 0
        """The ticket of the next item queued."""
        self._settled = 0
        """Every ticket below this one is written (or withdrawn)."""
        self._in_flight: trio.Event | None = None
        """Set when the batch being written now is done (None: none is)."""
        self._in_flight_last = -1
        """The last ticket of the batch being written now."""
        self._heir_of: trio.Event | None = None
        """The batch (its event) an heir waits for, to write the next one after it. Only
        an heir of the batch in flight counts: an heir whose batch ended -- woken, not yet
        run -- may find its item written by another caller's batch and write nothing."""
        self._following: trio.Event | None = None
        """Set when the next batch is done: what the callers besides its writer (the heir)
        wait for -- woken once, when their batch is written, not also when the batch
        before it is (issue 46.4: a wake is a trio task switch per caller)."""
        self.batches = 0
        """Batches written so far (for tests and figures)."""

    @property
    def queued(self) -> int:
        """The ticket the next item will get: :meth:`wait` for ``queued - 1`` waits for
        everything queued so far."""
        return self._next

    @property
    def pending(self) -> ValuesView[T]:
        """The items not taken into a batch yet, in queue order (a live view)."""
        return self._queue.values()

    def queue(self, item: T) -> int:
        """Queue ``item`` for the next batch; its ticket, for :meth:`wait`."""
        ticket = self._next
        self._next += 1
        self._queue[ticket] = item
        return ticket

    def withdraw(self, ticket: int) -> bool:
        """Take a queued item back: True if it was not taken into a batch (it never
        will be), False if it is being written or was."""
        return self._queue.pop(ticket, None) is not None

    def take_all(self) -> list[T]:
        """Every queued item, taken out of the queue for the caller to write itself (a
        store closing: no task is left to write them)."""
        items = list(self._queue.values())
        self._queue.clear()
        self._settled = self._next
        self._wake_following()
        return items

    def written(self, ticket: int) -> bool:
        """Whether the item of ``ticket`` was written (or withdrawn)."""
        return ticket < self._settled

    async def wait(self, ticket: int) -> None:
        """Until the item of ``ticket`` is written: wait for the batch in flight, or
        write the queue's first ``max_batch`` items as the next batch, until one has held
        it. Raises what ``write`` raised only when this caller wrote the batch.

        A caller whose item came after the batch in flight either is the *heir* -- the
        first such: it waits for that batch and writes the next -- or waits for the next
        batch only."""
        while ticket >= self._settled:
            if self._in_flight is None:
                await self._write_next()
            elif ticket <= self._in_flight_last:  # in the batch being written
                await self._in_flight.wait()
            elif self._heir_of is self._in_flight:  # the next batch has its writer
                if self._following is None:
                    self._following = trio.Event()
                await self._following.wait()
            else:
                await self._succeed(self._in_flight)

    async def _succeed(self, in_flight: trio.Event) -> None:
        """Wait for the batch in flight as the heir: the writer of the next batch (the
        caller's loop writes it as soon as this returns, with no checkpoint between). An
        heir that stops waiting (cancelled) wakes the callers that counted on it, so one
        of them writes instead."""
        self._heir_of = in_flight
        try:
            await in_flight.wait()
        except BaseException:
            if self._heir_of is in_flight:
                self._wake_following()
            raise
        finally:
            if self._heir_of is in_flight:
                self._heir_of = None

    def _wake_following(self) -> None:
        following, self._following = self._following, None
        if following is not None:
            following.set()

    async def _write_next(self) -> None:
        limit = len(self._queue) if self.max_batch is None else self.max_batch
        if len(self._queue) <= limit:  # the whole queue (the usual case): at once
            batch = list(self._queue.values())
            self._queue.clear()
            last = self._next - 1
        else:
            batch = []
            while len(batch) < limit:
                last, item = self._queue.popitem(last=False)
                batch.append(item)
        done = self._following if self._following is not None else trio.Event()
        self._in_flight, self._following = done, None  # (those waiting for the next: this)
        self._in_flight_last = last
        try:
            if batch:
                self.batches += 1
                await self._write(batch)
        finally:
            self._settled = max(self._settled, last + 1)
            self._in_flight = None
            done.set()
