"""The seam between the front ends and where sessions live (issue 41, phase 1).

Every front end (the HTTP API, AG-UI, A2A, the viewer's API, ``cantrip mcp``'s server
side, ACP) asks the same few things of the place its sessions live; today each asks
them twice, once of the in-process :class:`~cantrip.protocols._sessions.SessionHub`
and once of ``serve --db``'s :class:`~cantrip.protocols._db_sessions.DbSessions`
(reached through :class:`~cantrip.protocols._shell.ServerShell`'s hooks, typed
``Any``, :class:`~cantrip.protocols._a2a.A2AHandler`'s and
:class:`~cantrip.protocols._db_replica.Replica`). :class:`SessionBackend` says it
once, typed: sessions are named by id (a string), never handed out as objects, and
every answer is one of the values below. Two adapters implement it over today's code
(:mod:`._process`, :mod:`._postgres`); ``tests/test_session_backend_contract.py`` runs
one set of tests against both and against a double that implements it alone.

The operations, and what both modes do today
--------------------------------------------

* **sessions** -- ``create`` (with an idempotency key: the session that key made,
  anywhere, any time before), ``sessions`` (list), ``find`` (one; a top-level entity
  the loom holds counts, and in process is resumed from the loom).
* **submit** a prompt with an idempotency key and a busy policy (``reject``,
  ``enqueue``, ``interrupt``, ``rollback``); it returns as soon as the prompt is
  accepted (running or waiting its turn) with the id a cancel can name; ``result``
  waits for how it ended. A key seen before joins the running prompt or replays the
  recorded one (``replayed``); the same key with another intent is ``key_reused``.
* **steer** -- a message for the running prompt; it joins the next turn, or comes
  back in the result's ``undelivered`` when the cast ended first.
* **cancel** -- the running prompt, or the one named by id or key (``running``,
  ``starting``/``queued``), a key not seen yet armed for ``sticky_s`` (``next``),
  ``next_prompt`` to cut off whatever starts next; ``ended``/``none`` otherwise.
* **follow** a session's events from a position: the position is the number of the
  session's turns already seen (0: from its beginning); recorded turns after it
  come first, then what happens, each turn with its position.
* **pauses** and **answer** -- the calls the session waits on a human for; an
  answer continues the paused cast (a prompt of its own, awaited with ``result``);
  a pause is answered once.
* **thread** (the session's turns, root first), **health**, **capabilities**.

Where the two modes drift today (each shown by a test of the contract suite, named
``test_drift_*``; phase 2 removes them by moving the protocols onto this seam and the
behaviour into the backends)
------------------------------------------------------------------------------

1. *An ended prompt named by id.* ``SessionHub.request_cancel(prompt_id=...)`` knows
   only the prompts running or arriving, so a cancel naming one that ended answers
   ``none``; ``DbSessions.cancel`` finds the work item and answers ``ended``
   (``test_drift_cancel_naming_an_ended_prompt_by_id``).
2. *Prompt ids are not durable in process.* An unkeyed prompt's id is random and
   known only to the process that ran it (:meth:`result` of it elsewhere, or of an
   answer's continuation, is unknown); on PostgreSQL it is the work item's id, any
   replica resolves it (``test_drift_an_answer_continuation_has_a_cancellable_prompt_id``).
3. *A pause answered twice at once.* In process the second answer, while the first
   one's continuation runs, is ``busy`` (the hub sees a running cast before the
   pause); on PostgreSQL it is a :class:`~cantrip.PauseError` (``already answered``)
   (``test_drift_a_pause_answered_twice_at_once``).
4. *A cancel of the next prompt.* In process the next prompt's cast is cut off as it
   starts and records a cancelled turn (a result with reason ``cancelled``); on
   PostgreSQL its work item is cancelled as it is queued and records nothing (no
   result) (``test_drift_a_cancel_of_the_next_prompt``).
5. *Events.* In process ``/events`` hears the entity's every event live (token deltas,
   tool calls, usage) from now on only; on PostgreSQL a replica tails the loom: a
   ``step_complete`` per turn (and ``final_response``), which could resume from any
   position, though the HTTP route starts from "now" too. The seam gives both a
   position; ``capabilities.token_events`` says which mode has the live events
   (``test_drift_live_token_events``).
6. *Where refusals are decided.* In process ``overloaded``/``shutting_down`` are the
   hub's (``SessionHub.prompt``) and a prompt waiting its turn (``enqueue``) meets
   them when its turn comes; on PostgreSQL they are the replica's
   (``DbHttpApp._enqueue``, a count of the waits at this replica), decided before
   queuing, and ``DbSessions`` has neither. The HTTP in-process stream repeats the
   hub's ``busy`` check to answer 409 before its stream starts
   (``HttpApp._stream_prompt``). Not in the contract: lifecycle is the middleware's.
7. *Errors from below.* The ``--db`` front ends get the database's failures as
   :class:`~cantrip.protocols._asgi.HttpError` (``DbHttpApp._db``: 503
   ``database_unavailable``, 400, 500), so AG-UI and A2A on ``--db`` translate HTTP
   statuses back (``_a2a_db.protocol_errors``); in process they catch
   :class:`~cantrip.protocols._sessions.SessionError`. The seam raises
   ``SessionError`` and :class:`~cantrip.PauseError` only.
8. *What one mode lacks.* A2A push notifications and the viewer's fork are in process
   only (``capabilities``); ``serve --db`` never resumes an entity, so ``find`` of a
   session does not touch the entity, while in process it may resume it from the
   loom (and drops idle ones, :mod:`cantrip.protocols._limits`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Literal, Protocol, get_args

import attrs

from cantrip._approval import Decision, Pause
from cantrip._outcome import CastResult
from cantrip.loom._model import Turn

BusyPolicy = Literal["reject", "enqueue", "interrupt", "rollback"]
"""What a prompt does when its session is running one (double-texting)."""
BUSY_POLICIES: tuple[BusyPolicy, ...] = get_args(BusyPolicy)

CancelTarget = Literal["running", "starting", "queued", "next", "ended", "none"]


@attrs.frozen
class SessionInfo:
    """A session: its id, its entity, whether a prompt of it is open, its turns."""

    session_id: str
    entity_id: str
    running: bool
    turns: int

    def to_dict(self) -> dict[str, Any]:
        """The API's ``SessionInfo`` shape."""
        return attrs.asdict(self)


@attrs.frozen
class Submitted:
    """A prompt the backend accepted: running, or waiting its turn."""

    prompt_id: str
    """What :meth:`SessionBackend.cancel` and :meth:`SessionBackend.result` name it by."""
    session_id: str
    replayed: bool = False
    """Its idempotency key named a prompt seen before: nothing new was started."""


@attrs.frozen
class PromptOutcome:
    """How a prompt (or an answer's continuation) ended."""

    prompt_id: str
    cast: CastResult | None
    """None: it was cut off before it recorded a turn."""
    undelivered: tuple[str, ...] = ()
    """Steering messages no turn took (the cast ended first, or never began)."""


@attrs.frozen
class Cancelled:
    """What a cancel cut off, or will (the API's ``Cancelled`` answer)."""

    cancelled: bool
    target: CancelTarget
    prompt_id: str | None = None
    idempotency_key: str | None = None
    intent: str | None = None
    sticky_s: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cancelled:
        return cls(
            cancelled=bool(data["cancelled"]),
            target=data["target"],
            prompt_id=data.get("prompt_id"),
            idempotency_key=data.get("idempotency_key"),
            intent=data.get("intent"),
            sticky_s=data.get("sticky_s"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in attrs.asdict(self).items() if v is not None or k == "cancelled"}


@attrs.frozen
class SessionEvent:
    """One event of a session, in the JSON shape streams carry
    (:func:`~cantrip.protocols._sessions.event_dict`)."""

    type: str
    data: dict[str, Any]
    position: int | None = None
    """For a recorded turn (``step_complete``): how many of the session's turns there
    are up to it -- follow from here to resume after it. None for what is not a turn."""
    turn: Turn | None = None


@attrs.frozen
class Health:
    mode: str
    running: int
    """Prompts running (in process) or waited on (at this replica)."""
    sessions: int
    persistent: bool


@attrs.frozen
class Capabilities:
    """What a backend offers beyond the contract every backend keeps: the one place a
    mode's missing feature is declared (the docs' table of modes is to be generated
    from it)."""

    mode: str
    token_events: bool
    """``follow`` carries token deltas, tool calls and usage as they happen (not only
    the recorded turns)."""
    a2a_push: bool
    """A2A push notifications (a webhook's credentials live in this process's memory)."""
    viewer_fork: bool
    """The viewer's ``POST /api/fork`` (a new session continuing from a turn)."""
    durable_prompt_ids: bool
    """Every prompt id (an answer's continuation's too) is known to every process
    serving the sessions, and after a restart."""
    shared: bool
    """Several processes (replicas) serve the same sessions."""


class SessionBackend(Protocol):
    """Where sessions live and casts run; see the module docstring. Every method
    raises :class:`~cantrip.protocols._sessions.SessionError` for a request it cannot
    serve (``kind``: ``not_found``, ``busy``, ``not_running``, ``key_reused``,
    ``steering_full``, ``cast_failed``) and :class:`~cantrip.PauseError` for an answer
    to a pause that is not waiting."""

    @property
    def capabilities(self) -> Capabilities: ...

    async def create(self, key: str | None = None) -> tuple[SessionInfo, bool]:
        """A new session, or the one ``key`` created; the flag says whether it is new."""
        ...

    async def sessions(self) -> list[SessionInfo]: ...

    async def find(self, session_id: str) -> SessionInfo:
        """The session named (``not_found`` if none)."""
        ...

    async def submit(
        self,
        session_id: str,
        intent: str,
        *,
        key: str | None = None,
        on_busy: BusyPolicy = "reject",
    ) -> Submitted:
        """Accept a prompt (``busy`` for ``reject`` while one runs); returns once it
        runs or waits its turn."""
        ...

    async def result(self, session_id: str, prompt_id: str) -> PromptOutcome:
        """Wait for the prompt to end (``not_found``: no such prompt of the session;
        ``cast_failed``: it failed for good)."""
        ...

    async def steer(self, session_id: str, text: str) -> None:
        """A message for the running prompt (``not_running`` if none)."""
        ...

    async def cancel(
        self,
        session_id: str,
        *,
        prompt_id: str | None = None,
        key: str | None = None,
        next_prompt: bool = False,
    ) -> Cancelled: ...

    def follow(self, session_id: str, after: int = 0) -> AsyncGenerator[SessionEvent, None]:
        """The session's turns after its ``after``-th (recorded ones first), then its
        events as they happen, for as long as the caller iterates."""
        ...

    async def pauses(self, session_id: str) -> list[Pause]: ...

    async def answer(self, session_id: str, pause_id: str, decision: Decision) -> Submitted | None:
        """Answer a pause: the continued cast as a prompt (await its :meth:`result`),
        or None when a running prompt waited on it in place (that prompt answers)."""
        ...

    async def thread(self, session_id: str) -> list[Turn]: ...

    async def health(self) -> Health: ...
