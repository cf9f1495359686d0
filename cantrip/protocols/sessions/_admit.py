"""How a ``serve --db`` replica puts prompts on the queue: many requests, one commit.

A replica under many clients at once would otherwise pay one transaction -- one fsync --
per prompt. :class:`PromptCommits` gathers them the way a worker's loom gathers its
entities' writes (:class:`~cantrip.loom._group_commit.GroupCommit`, the one rule for
both): one batch is written at a time, and every prompt that arrives while it commits
goes into the next, at most ``max_batch`` of them; there is no timer, so a prompt alone
goes at once. A batch is one transaction (:meth:`DbSessions.enqueue_batch`), each prompt
in a savepoint of its own, so one bad prompt -- ``busy``, ``key_reused``, a constraint,
input the database cannot hold -- fails alone, with its own error, and the others are
queued. Each request hears its own prompt's outcome only once the batch's commit is
done. A batch that fails as a whole (a lost connection, a failed commit) queued nothing,
and each of its requests is told so.

Also here, so there is one of it: what a database failure is as a front end's
:class:`SessionError` (:func:`refusal`, :func:`unavailable`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from cantrip._redact import get_logger
from cantrip.distributed._outage import is_connection_error
from cantrip.loom._group_commit import GroupCommit
from cantrip.protocols.sessions._backend import SessionError
from cantrip.protocols.sessions._enqueue import PromptRequest, Queued
from cantrip.protocols.sessions._rows import DbSessions

log = get_logger("cantrip.sessions")

DB_UNAVAILABLE = "database_unavailable"
"""The :class:`SessionError` kind of a call made while the database is unreachable."""
MAX_PROMPTS_PER_COMMIT = 100
"""The most prompts one transaction queues: a batch holds its entities' locks (and the
rows of their running work) until it commits, so it is kept to tens of milliseconds."""

RunDb = Callable[
    [Callable[[Sequence[PromptRequest]], list[Queued | Exception]], Any], Awaitable[Any]
]
"""The backend's way to run a blocking database call (its thread, limiter and outage
bookkeeping): called with the function and its argument."""


@attrs.define
class _Waiting:
    """A prompt waiting for its batch, and then what became of it."""

    prompt: PromptRequest
    outcome: Queued | Exception | None = None


class PromptCommits:
    """The prompts a replica queues, written a batch per commit (see the module
    docstring)."""

    def __init__(
        self, sessions: DbSessions, run_db: RunDb, *, max_batch: int = MAX_PROMPTS_PER_COMMIT
    ) -> None:
        self._sessions = sessions
        self._run_db = run_db
        self._commits: GroupCommit[_Waiting] = GroupCommit(self._write, max_batch=max_batch)

    @property
    def batches(self) -> int:
        """Batches written so far (each one commit)."""
        return self._commits.batches

    @property
    def waiting(self) -> int:
        """Prompts waiting for a batch (not taken into one yet)."""
        return len(self._commits.pending)

    async def enqueue(self, prompt: PromptRequest) -> Queued:
        """Queue ``prompt`` with the others that arrive meanwhile; its own outcome once
        its batch has committed (a refusal as its :class:`SessionError`).

        Cancelled while the prompt still waits for a batch, it is withdrawn: never
        queued. Once in a batch it stays there -- the batch holds other requests'
        prompts -- and is queued with them, as a cancel just after the commit would
        leave it (its key, if it has one, finds it again)."""
        waiting = _Waiting(prompt)
        ticket = self._commits.queue(waiting)
        try:
            await self._commits.wait(ticket)
        finally:
            self._commits.withdraw(ticket)  # (a no-op once it was taken into a batch)
        outcome = waiting.outcome
        if isinstance(outcome, Queued):
            return outcome
        assert outcome is not None, "a batch ended without an outcome for one of its prompts"
        if isinstance(outcome, SessionError):  # its own: a failed batch's is shared
            raise SessionError(outcome.kind, outcome.message) from None
        refused = refusal(outcome)
        if refused is not None:
            raise refused from None
        if is_connection_error(outcome):  # its statement alone was cut off (a deadlock)
            raise unavailable() from None
        raise outcome

    async def _write(self, batch: list[_Waiting]) -> None:
        """Write a batch (the group commit's writer), shielded: it holds other requests'
        prompts, which they wait for."""
        prompts = [w.prompt for w in batch]
        with trio.CancelScope(shield=True):
            try:
                outcomes = await self._run_db(self._sessions.enqueue_batch, prompts)
            except Exception as exc:  # noqa: BLE001 -- the batch failed as a whole: so did
                outcomes = [exc] * len(batch)  # each prompt, and each caller hears it
        for waiting, outcome in zip(batch, outcomes, strict=True):
            waiting.outcome = outcome


def refusal(exc: Exception) -> SessionError | None:
    """A database's failure as what a front end is told: input PostgreSQL cannot hold
    (``DataError``) is ``bad_request``, any other database error -- a lost connection
    excepted, the caller's to wait out -- ``database_error``; each logged once, here.
    None for anything else (raised as it is)."""
    import psycopg

    if isinstance(exc, psycopg.DataError):
        log.info("input the database cannot hold: %s", _first_line(exc))
        return SessionError(
            "bad_request", f"the database cannot hold this input: {_first_line(exc)}"
        )
    if isinstance(exc, psycopg.Error) and not is_connection_error(exc):
        log.error("database error (%s): %s", type(exc).__name__, _first_line(exc))
        return SessionError("database_error", f"the database failed: {type(exc).__name__}")
    return None


def unavailable() -> SessionError:
    """The refusal of a call made while the database is unreachable."""
    return SessionError(DB_UNAVAILABLE, "the database is unreachable; try again shortly")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
