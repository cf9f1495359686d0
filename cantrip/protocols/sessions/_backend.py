"""The seam between the front ends and where sessions live (issue 41).

Every front end (the HTTP API, AG-UI, A2A, the viewer's API, ``cantrip mcp``'s server
side, ACP) asks the same few things of the place its sessions live: the in-process
:class:`~cantrip.protocols.sessions._hub.SessionHub` or ``serve --db``'s
:class:`~cantrip.protocols.sessions._rows.DbSessions`. Before this seam each asked
twice, through the HTTP server shell's twenty hooks typed ``Any``, A2A's handler's
hooks and a replica protocol, and the copies drifted (below).
:class:`SessionBackend` says it once, typed: sessions are named by id (a string), never
handed out as objects, and every answer is one of the values below. A prompt's calls
(``submit``, ``result``, ``follow``), ``thread`` and ``pauses`` take instead the
:class:`SessionInfo` the front end's ``find`` (or ``create``) gave it in the same request
(:data:`SessionRef`): the session is read once per request, not once per call (on
PostgreSQL a read is a transaction) -- every front end hands down what it read. Two backends
implement it (:mod:`._process`, :mod:`._postgres`);
``tests/test_session_backend_contract.py`` runs one set of tests against both and
against a double that implements it alone.

The operations
--------------

* **sessions** -- ``create`` (with an idempotency key: the session that key made,
  anywhere, any time before), ``sessions`` (list), ``find`` (one; a top-level entity
  the loom holds counts, and in process is resumed from the loom), ``summaries`` (every
  top-level entity of the loom with its title, last activity and ``cwd``: ACP's list).
* **submit** a prompt with an idempotency key, a busy policy (``reject``,
  ``enqueue``, ``interrupt``, ``rollback``) and the client's own tools (AG-UI's,
  offered to this prompt only: in process ``Entity.offer`` as it starts, on
  PostgreSQL ``CLIENT_TOOLS_KEY`` in its queued spell); it returns as soon as the prompt is
  accepted (running or waiting its turn) with the id a cancel can name; ``result``
  waits for how it ended. A key seen before joins the running prompt or replays the
  recorded one (``replayed``); the same key with another intent is ``key_reused``.
* **steer** -- a message for the running prompt; it joins the next turn, or comes
  back in the result's ``undelivered`` when the cast ended first.
* **cancel** -- the running prompt, or the one named by id or key (``running``,
  ``queued`` waiting its turn, ``starting`` its request arriving), a key not seen
  yet armed for ``sticky_s`` (``next``),
  ``next_prompt`` to cut off whatever starts next; ``ended``/``none`` otherwise.
* **follow** a session's events from a position: the position is the number of the
  session's turns already seen (0: from its beginning); recorded turns after it
  come first, then what happens, each turn with its position.
* **pauses** and **answer** -- the calls the session waits on a human for; an
  answer continues the paused cast (a prompt of its own, awaited with ``result``);
  a pause is answered once.
* **thread** (the session's turns, root first), **health**, **capabilities**.
* **delete** -- the session's tree removed from the loom by the retention rule (one
  implementation per store, :mod:`cantrip.loom._retention`); refused ``busy`` while a
  prompt of it is open.
* **tasks** -- a protocol's record beside a prompt (A2A's task: its id, the client's
  messages, the prompt it follows now): ``submit_task`` submits the prompt and records
  the task in one step (on PostgreSQL one transaction: a task exists exactly when its
  prompt does), ``task``/``tasks`` read them with their prompt's state (open, ended with
  its redacted result dict, failed), ``answer_task`` answers the pause the task waits
  on and moves it to the continuation in one step (of two answers one wins),
  ``cancel_waiting_task`` marks a task that waits for input cancelled. What is stored
  is the backend's: rows of ``cantrip_a2a_tasks`` on PostgreSQL, a bounded map in
  process (``MAX_TASKS``). ``follow(..., until=prompt_id)`` ends once that prompt has
  ended and its turns were told (a stream of one task).
* **read_loom** -- a read of the loom the sessions are recorded in (the viewer's API),
  where reading belongs: at once in process, in a worker thread behind the store's
  limiter on PostgreSQL (a query blocks); **fork** -- a new session continuing from a
  recorded turn (the viewer's ``POST /api/fork``), where ``capabilities.viewer_fork``.
* **release** -- let go of what the backend holds in memory for an idle session (in
  process its entity, and the gate providers that entity opened: a front end that
  makes a session per call, ``cantrip mcp``, releases it when the call ends); its loom
  stays, and the next operation naming it resumes it.

Where the two modes drifted (found by the contract suite when the seam was cut; each
removed one names the test that shows both modes agree; 8, 9 and 13 are what a mode
is, said by :class:`Capabilities`, and 10 is left)
------------------------------------------------------------------------------------

1. *A cancel naming a prompt queued behind another* -- removed (phase 2): on
   PostgreSQL ``DbSessions.cancel`` called ``cancel_on`` without the work id, and the
   ``cantrip_cancel`` notification named the entity only, so every open prompt of the
   session was cut off, the running one too. Now only the work item named is (its
   notification carries the work id; a worker cuts off its cast only if it runs that
   item). ``test_a_cancel_naming_a_prompt_that_waits_its_turn_cuts_off_that_one_only``,
   ``tests/test_serve_db.py::test_a_cancel_naming_a_queued_prompt_leaves_the_others_queued``.
2. *One state, two names* -- removed (phase 2): a prompt waiting its turn, named by a
   cancel, was ``starting`` in process (the name of a request still arriving),
   ``queued`` on PostgreSQL; now ``queued`` in both (``Prompt.waiting``). The contract
   test of drift 1 asserts it.
3. *Waiters are not served in order in process* -- removed (phase 2): two prompts
   ``enqueue``-d behind a running one raced for the session when it ended ("the first
   to wake goes", ``SessionHub._make_way``); now the hub keeps them in line
   (``Session.waiting``, FIFO, as the PostgreSQL queue serves an entity's work in id
   order). ``test_prompts_waiting_their_turn_run_in_the_order_they_came``.
4. *An ended prompt named by id* -- removed (phase 2): in process it was ``none``
   (the hub knew the running and arriving prompts only), on PostgreSQL ``ended``. Now
   ``ended`` in both (a session remembers its latest ended prompt ids,
   ``MAX_ENDED_PROMPTS``): the client reads the result.
   ``test_a_cancel_naming_an_ended_prompt_says_it_ended``.
5. *An answer's continuation cannot be cancelled in process* -- removed (phase 2):
   ``SessionHub.answer`` ran it with no ``current`` prompt, so a cancel, named or not,
   found nothing, and its prompt id was this adapter's own. Now it is a
   :class:`~cantrip.protocols.sessions._hub.Prompt` (``answer``'s ``handle``), the
   session's current one while it runs, as on PostgreSQL where it is a work item like
   any prompt. ``test_an_answer_continuation_is_a_prompt_a_cancel_cuts_off``,
   ``tests/test_http_pause.py::test_a_cancel_cuts_off_an_answer_being_carried_out``.
6. *A pause answered twice at once* -- removed (phase 2): in process the second
   answer, while the first one's continuation ran, was ``busy``; on PostgreSQL a
   :class:`~cantrip.PauseError`. Now a ``PauseError`` in both (the hub checks the
   pause it is carrying out, ``Session.answering``, before ``busy``).
   ``test_a_pause_answered_twice_at_once_is_answered_once``.
7. *A cancel of the next prompt* (``next_prompt``, or a key armed before its prompt)
   -- removed (phase 2): in process the prompt's cast was cut off as it started and
   recorded a cancelled turn -- its intent stayed in the conversation, a later prompt's
   model saw it; on PostgreSQL its work item was cancelled as it was queued and recorded
   nothing. One rule now, PostgreSQL's: a prompt cut off before it started records
   nothing (``SessionHub._withdraw``; its key is remembered, ``Session.unstarted``, so a
   repeat replays it and a cancel naming it is ``ended``) -- the client took it back.
   ``test_a_prompt_cut_off_before_it_starts_records_nothing``.
8. *Live events*: in process ``follow`` hears the entity's every event (token deltas,
   tool calls, usage); on PostgreSQL a replica tails the loom (``step_complete`` per
   turn, ``final_response``, pauses). ``capabilities.token_events`` says which.
   ``test_drift_live_token_events``. (Today's HTTP ``/events`` starts from "now" in
   both modes; the seam's ``follow`` takes a position in both.)
9. *A cancel is synchronous in process, asynchronous on PostgreSQL*: ``cancelled:
   true`` there means the worker was told; a cast whose model call answers before it
   hears ends ``done``. The contract awaits a cut-off prompt's result while its model
   call is held, so both pass; a client must read the result, not the cancel's answer.
10. *A message sent while a prompt is queued* (PostgreSQL accepts it: open work
    counts; in process there is no queued prompt to take one) is handed to the cast as
    it begins and recorded on its first turn, shown before its intent -- the model
    answers the intent, not the message. Seen once in this suite's first runs (a cast
    that ran to ``max_turns``); the contract steers once the first turn is recorded.
11. *Where refusals are decided* -- removed (phase 2): ``overloaded``/``shutting_down``
    were the hub's in process (a prompt waiting its turn met them when its turn came)
    and the replica's on PostgreSQL (before queuing); ``HttpApp._stream_prompt``
    repeated the hub's ``busy`` check. Now the server decides them in one place for
    both modes, before the backend sees a prompt
    (:class:`~cantrip.protocols.middleware._lifecycle.Admission`), and ``busy`` is the
    backend's ``submit``'s, answered before a stream starts.
    ``tests/test_http_load.py::test_a_prompt_beyond_max_running_is_refused_before_it_queues``.
    In process ``SessionHub.admit`` decides every refusal of a prompt with no
    checkpoint (``SessionHub.prompt`` = ``admit`` + ``run``), so ``submit`` answers it
    without counting on trio's scheduling
    (``test_a_prompt_admitted_holds_its_place_before_its_cast_begins``).
12. *Errors from below* -- removed (phase 2): the ``--db`` server got the database's
    failures as ``HttpError`` (``DbHttpApp._db``). Now :class:`PostgresBackend` raises
    them as :class:`SessionError` kinds (``database_unavailable``, ``database_error``,
    ``bad_request``; ``cast_dead_lettered``), which one status table answers
    (:mod:`cantrip.protocols.http._errors`); the HTTP API catches nothing else.
    ``tests/test_serve_db.py`` (``database_unavailable``) and
    ``tests/test_serve_db_faults.py`` (``cast_dead_lettered``) through the one app.
    AG-UI and A2A are one run and one handler over the seam (phase 2, steps 3 and 4);
    A2A maps the two errors to JSON-RPC errors once
    (:func:`cantrip.protocols.a2a._handler.protocol_errors`);
    ``tests/test_a2a_modes.py`` runs its refusals against both modes.
13. *What one mode lacks*: A2A push notifications and the viewer's fork are in process
    only (``capabilities``; the viewer reads either mode's loom through ``read_loom``
    and answers a fork 501 where ``viewer_fork`` is false, ``tests/test_serve_db.py``'s
    ``test_the_viewer_of_a_replica_reads_the_loom_through_its_backend_and_does_not_fork``);
    prompt ids are durable on PostgreSQL only (an unkeyed prompt's id is random and
    known to the process that ran it). In process ``find``
    may resume the entity from the loom (and idle ones are dropped,
    :mod:`cantrip.protocols.sessions._limits`); a replica never holds an entity.
14. *A client's tools outlived their prompt in process* -- removed (phase 2, step 3):
    AG-UI offered a run's tools to the entity (``Entity.offer``) and they stayed
    offered to every later prompt (the HTTP API's too) until an AG-UI run offered
    others; on PostgreSQL each work item carries its own (``CLIENT_TOOLS_KEY``). Now
    ``submit(..., tools=)`` in both, and the hub offers a prompt's own tools as it
    starts (none for a prompt without).
    ``test_a_prompt_offers_the_clients_tools_and_a_call_of_one_waits_for_its_result``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from cantrip._approval import Decision, Pause
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.protocols.sessions._values import (
    BUSY_POLICIES,
    ENTITY_PREFIX,
    MAX_CWD_CHARS,
    MAX_TASKS,
    SESSION_PREFIX,
    BusyPolicy,
    Cancelled,
    CancelTarget,
    Capabilities,
    EventId,
    Health,
    PromptOutcome,
    SessionError,
    SessionEvent,
    SessionInfo,
    SessionRef,
    SessionSummary,
    Submitted,
    TaskRecord,
    TaskState,
    capabilities_table,
    check_cwd,
    check_user,
    entity_id_for,
    same_user,
    session_id_for,
    session_id_of,
)
from cantrip.protocols.sessions._watches import PromptWatches

__all__ = [  # the values are re-exported: every importer keeps this path
    "BUSY_POLICIES",
    "ENTITY_PREFIX",
    "MAX_CWD_CHARS",
    "MAX_TASKS",
    "SESSION_PREFIX",
    "BusyPolicy",
    "CancelTarget",
    "Cancelled",
    "Capabilities",
    "EventId",
    "Health",
    "PromptOutcome",
    "SessionBackend",
    "SessionError",
    "SessionEvent",
    "SessionInfo",
    "SessionRef",
    "SessionSummary",
    "Submitted",
    "TaskRecord",
    "TaskState",
    "capabilities_table",
    "check_cwd",
    "check_user",
    "entity_id_for",
    "same_user",
    "session_id_for",
    "session_id_of",
]

T = TypeVar("T")


class SessionBackend(Protocol):
    """Where sessions live and casts run; see the module docstring. Every method
    raises :class:`~cantrip.protocols.sessions._hub.SessionError` for a request it cannot
    serve (``kind``: ``not_found``, ``busy``, ``not_running``, ``key_reused``,
    ``steering_full``, ``cast_failed``, ``cast_dead_lettered``, ``bad_tools``; where storage fails:
    ``database_unavailable``, ``database_error``, ``bad_request``) and
    :class:`~cantrip.PauseError` for an answer to a pause that is not waiting -- nothing
    else (no HTTP status: the front end maps kinds, drift 12)."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def watches(self) -> PromptWatches:
        """Who follows which prompt for a client, shared by every process serving the
        sessions (:mod:`._watches`: a hang-up's grace, AG-UI's ``?reconnect_s=``)."""
        ...

    async def create(
        self, key: str | None = None, *, user: str | None = None, cwd: str | None = None
    ) -> tuple[SessionInfo, bool]:
        """A new session, or the one ``key`` created; the flag says whether it is new.
        ``user`` (:func:`check_user`) is the ``user`` tag of every cast of the session;
        a key naming a session of another user is ``user_conflict`` (:func:`same_user`).
        ``cwd`` (:func:`check_cwd`): where it was created, its casts' ``cwd`` tag (a key
        naming a session keeps the one it was created with)."""
        ...

    async def sessions(self) -> list[SessionInfo]: ...

    async def summaries(self) -> list[SessionSummary]:
        """Every session the loom holds (a top-level entity, an earlier process's too) as
        a list shows it -- title, last activity, recorded ``cwd`` -- most recently active
        first (:mod:`._summaries`: on PostgreSQL one statement, whatever their number)."""
        ...

    async def find(self, session_id: str) -> SessionInfo:
        """The session named (``not_found`` if none)."""
        ...

    async def submit(
        self,
        session: SessionRef,
        intent: str,
        *,
        key: str | None = None,
        on_busy: BusyPolicy = "reject",
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> Submitted:
        """Accept a prompt (``busy`` for ``reject`` while one runs); returns once it
        runs or waits its turn.

        ``tools``: the client's own tools (AG-UI's), definitions with ``name``,
        ``description`` and ``parameters``. They are offered to this prompt's cast and
        to an answer's continuation of it, in place of any a prompt before offered; a
        call of one waits like an ``ask_user`` question, and the client's result
        answers it (:meth:`answer`). A name no provider takes, or one given twice, is
        ``bad_tools`` (a name the circle has is the front end's to refuse: it knows
        the circle)."""
        ...

    async def result(self, session: SessionRef, prompt_id: str) -> PromptOutcome:
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

    def follow(
        self,
        session: SessionRef,
        after: int | EventId = 0,
        *,
        until: str | None = None,
        prompt_id: str | None = None,
    ) -> AsyncGenerator[SessionEvent, None]:
        """The session's events after ``after`` (recorded ones first, from the loom),
        then its events as they happen, for as long as the caller iterates -- or, with
        ``until`` (a prompt id of the session, ``not_found`` otherwise), until that
        prompt has ended and its turns were told. Every event carries its ``id``
        (:mod:`._positions`). ``after``: an event id (what a client resumes after), or
        a number of turns (after that turn and what it recorded); one past the
        session's present is ``bad_request``. A resume after a live event no longer
        held begins with a ``reset`` event; a follower that falls
        :data:`~._positions.WATCHER_BUFFER` events behind is told ``dropped`` and ends.

        With ``prompt_id`` (one :meth:`submit` or :meth:`answer` returned): that
        prompt's events only, from its beginning (or after ``after``, an event id: a
        client resuming the stream), ending when it ends (a pause it ended waiting on
        comes before the end) -- a prompt's own stream (``not_found``: no such
        prompt)."""
        ...

    async def pauses(self, session: SessionRef) -> list[Pause]:
        """The calls the session waits on a human for now (the session named as
        :meth:`thread`'s: its pauses are read afresh either way)."""
        ...

    async def answer(
        self, session_id: str, pause_id: str, decision: Decision, *, repeat: bool = False
    ) -> Submitted | None:
        """Answer a pause: the continued cast as a prompt (await its :meth:`result`),
        or None when a running prompt waited on it in place (that prompt answers).
        ``repeat``: the client may be sending an answer again (it lost the reply): a
        pause answered already with this very decision gives the continuation that
        answer started (``replayed``) -- where the backend still knows it -- instead
        of a :class:`~cantrip.PauseError`; another decision is one all the same."""
        ...

    async def thread(self, session: SessionRef) -> list[Turn]:
        """The session's turns, root first (a :data:`SessionRef`: the front end's look
        of this request names it, and is not read again)."""
        ...

    async def read_loom(self, read: Callable[[Loom], T]) -> T:
        """``read`` run over the loom the sessions are recorded in, where reading it
        belongs (a query blocks: a worker thread). ``read`` only reads; the loom may
        have grown since the last call."""
        ...

    async def delete(self, session_id: str) -> None:
        """Remove the session: its whole tree from the loom by the retention rule
        (:func:`~cantrip.loom._retention.prune` with ``entity=``, each store's one
        implementation; on PostgreSQL its queue rows, pauses and session row with it),
        and whatever memory holds of it. ``busy`` while a prompt of it is open (running
        or waiting its turn; in process also while somebody follows it),
        ``not_found`` for no such session (an entity of the runtime's own is none),
        ``cannot_delete`` when the rule keeps it (a fork stands on it),
        ``unsupported`` for a loom that cannot delete (in memory, JSONL)."""
        ...

    async def fork(self, turn_id: str) -> SessionInfo:
        """A new session whose entity continues from the recorded turn ``turn_id``
        (LOOM-4): ``not_found`` for a turn the loom lacks, ``cannot_fork`` for one that
        cannot be continued, ``unsupported`` where ``capabilities.viewer_fork`` is
        False."""
        ...

    async def release(self, session_id: str) -> None:
        """Let go of what this backend holds in memory for the session, if no prompt
        of it is open and nobody follows it (else, and for a session not held, nothing):
        its loom stays, and the next operation naming it resumes it."""
        ...

    async def health(self) -> Health: ...

    # -- tasks: a protocol's record beside a prompt (A2A) ------------------------------

    async def submit_task(
        self,
        session_id: str,
        intent: str,
        *,
        task_id: str,
        message: str,
        on_busy: BusyPolicy = "reject",
    ) -> TaskRecord:
        """:meth:`submit` the prompt and record task ``task_id`` (its first message) with
        it, in one step: refused, neither is made."""
        ...

    async def task(self, task_id: str) -> TaskRecord | None: ...

    async def tasks(
        self, session_id: str | None, *, before: int | None = None, limit: int = MAX_TASKS
    ) -> list[TaskRecord]:
        """Tasks newest first (of one session if named; with ``seq`` below ``before``)."""
        ...

    async def answer_task(
        self, task_id: str, prompt_id: str, pause_id: str, decision: Decision, message: str
    ) -> TaskRecord | None:
        """Answer the pause the task waits on and move the task to the continuation
        (``message`` added), in one step; None if the task no longer follows
        ``prompt_id`` or was cancelled (a pause answered already: :class:`PauseError`)."""
        ...

    async def cancel_waiting_task(self, task_id: str, prompt_id: str) -> TaskRecord | None:
        """Mark the task, waiting for input at ``prompt_id``, cancelled; None if it
        moved on or was cancelled meanwhile."""

    async def shutdown(self, grace_s: float) -> None:
        """The server stops: prompts running in this process get ``grace_s`` to end,
        then are cut off (reason ``shutdown``); returns once none runs here. A backend
        whose casts run elsewhere (workers) returns at once: they go on."""
        ...
