"""Who follows a prompt for a client, and how long a prompt waits for a client that
hung up to come back (AG-UI's ``?reconnect_s=``, SPEC.md AGUI-7): the seam's
``watches`` (issue 44).

A client that loses its stream may come back at any replica; the grace a hang-up
grants must be shared by all of them, or the replica it left cancels the prompt
under the replica it came back to. So the rule is kept where the sessions live:

* a run that follows a prompt for its client :meth:`~PromptWatches.watch`-es it
  under a watcher id of its own, and :meth:`~PromptWatches.unwatch`-es it at its
  end -- with ``grace_s`` when its client hung up: its watch then lasts that long;
* when the grace is over, the run that granted it asks :meth:`~PromptWatches.watched`:
  its own watch ends, and the answer says whether another run follows the prompt
  now (or still waits out a grace of its own): if none, it cancels the prompt.

Whoever follows the prompt anywhere keeps it: the check is made when the grace
ends, at the replica that granted it, against the database. In process the watches
are a map (:class:`Watches`); on PostgreSQL a table every replica reads
(:class:`WatchRows`). A replica that dies while it follows leaves its watch behind:
the prompt then runs to its end rather than being cancelled -- what a replica's
death did to a grace in memory anyway (its timer died with it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

if TYPE_CHECKING:  # psycopg loads with the PostgreSQL backend only
    from cantrip.loom._postgres import PostgresStore


class PromptWatches(Protocol):
    """Runs following prompts for their clients (see the module docstring)."""

    async def watch(self, session_id: str, prompt_id: str, watcher: str) -> None:
        """``watcher`` follows the prompt for its client."""
        ...

    async def unwatch(
        self, session_id: str, prompt_id: str, watcher: str, *, grace_s: float = 0.0
    ) -> None:
        """``watcher`` stops following the prompt; with ``grace_s`` (its client hung
        up) its watch lasts that much longer: its client may come back elsewhere."""
        ...

    async def watched(self, session_id: str, prompt_id: str, watcher: str) -> bool:
        """``watcher``'s watch ends; whether another watcher follows the prompt now
        or is still within a grace of its own (then it decides when that ends)."""
        ...


class Watches:
    """:class:`PromptWatches` in memory: one process serves every client."""

    def __init__(self) -> None:
        self._watches: dict[tuple[str, str], dict[str, float | None]] = {}
        """(session, prompt) -> watcher -> the end of its grace (None: it follows)."""

    async def watch(self, session_id: str, prompt_id: str, watcher: str) -> None:
        self._watches.setdefault((session_id, prompt_id), {})[watcher] = None

    async def unwatch(
        self, session_id: str, prompt_id: str, watcher: str, *, grace_s: float = 0.0
    ) -> None:
        if grace_s > 0:
            self._watches.setdefault((session_id, prompt_id), {})[watcher] = (
                trio.current_time() + grace_s
            )
        else:
            self._drop(session_id, prompt_id, watcher)

    async def watched(self, session_id: str, prompt_id: str, watcher: str) -> bool:
        self._drop(session_id, prompt_id, watcher)
        now = trio.current_time()
        others = self._watches.get((session_id, prompt_id), {}).values()
        return any(until is None or until > now for until in others)

    def _drop(self, session_id: str, prompt_id: str, watcher: str) -> None:
        key = (session_id, prompt_id)
        watchers = self._watches.get(key, {})
        watchers.pop(watcher, None)
        if not watchers:
            self._watches.pop(key, None)


_SCHEMA_LOCK = 0x61677769  # "agwi": schema creation, once per database
_SCHEMA = """
CREATE TABLE IF NOT EXISTS cantrip_prompt_watches (
    work_id BIGINT NOT NULL,
    watcher TEXT NOT NULL,
    grace_until TIMESTAMPTZ,
    PRIMARY KEY (work_id, watcher)
);
"""


class WatchRows:
    """:class:`PromptWatches` on PostgreSQL: ``cantrip_prompt_watches`` (made on first
    use), a row per run following a work item for its client (``grace_until`` null
    while it follows). Times are the database's, so replicas' clocks never disagree.
    ``call`` runs a blocking call in a thread (the backend's boundary); a prompt id
    that names no work item is watched by nobody."""

    def __init__(
        self,
        store: PostgresStore,
        call: Callable[..., Awaitable[Any]],
        work_id_for: Callable[[str], int | None],
    ) -> None:
        self.store = store
        self.call = call
        self.work_id_for = work_id_for
        self._made = False

    async def _run(self, sql: str, params: tuple[Any, ...]) -> Any:
        if not self._made:
            await self.call(self._make)
            self._made = True
        return await self.call(self._execute, sql, params)

    def _make(self) -> None:
        with self.store.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(_SCHEMA)

    def _execute(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self.store.pool.connection() as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchone() if cursor.description is not None else None

    async def watch(self, session_id: str, prompt_id: str, watcher: str) -> None:
        work_id = self.work_id_for(prompt_id)
        if work_id is not None:
            await self._run(
                "INSERT INTO cantrip_prompt_watches (work_id, watcher) VALUES (%s, %s) "
                "ON CONFLICT (work_id, watcher) DO UPDATE SET grace_until = NULL",
                (work_id, watcher),
            )

    async def unwatch(
        self, session_id: str, prompt_id: str, watcher: str, *, grace_s: float = 0.0
    ) -> None:
        work_id = self.work_id_for(prompt_id)
        if work_id is None:
            return
        if grace_s > 0:
            await self._run(
                "UPDATE cantrip_prompt_watches SET grace_until = clock_timestamp() + "
                "make_interval(secs => %s) WHERE work_id = %s AND watcher = %s",
                (grace_s, work_id, watcher),
            )
        else:
            await self._run(
                "DELETE FROM cantrip_prompt_watches WHERE work_id = %s AND watcher = %s",
                (work_id, watcher),
            )

    async def watched(self, session_id: str, prompt_id: str, watcher: str) -> bool:
        work_id = self.work_id_for(prompt_id)
        if work_id is None:
            return False
        # one statement: the row goes, and the others are read as they were (a
        # data-modifying CTE and the query share one snapshot, hence ``<>``)
        row = await self._run(
            "WITH gone AS (DELETE FROM cantrip_prompt_watches WHERE work_id = %s AND "
            "(watcher = %s OR grace_until <= clock_timestamp())) "
            "SELECT EXISTS (SELECT 1 FROM cantrip_prompt_watches WHERE work_id = %s "
            "AND watcher <> %s AND (grace_until IS NULL OR grace_until > clock_timestamp()))",
            (work_id, watcher, work_id, watcher),
        )
        return bool(row[0])
