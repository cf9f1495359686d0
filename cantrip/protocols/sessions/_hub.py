"""Protocol sessions: summoned entities behind ids, shared by ACP and HTTP (PROD-1, PROD-7).

A :class:`SessionHub` owns the sessions of one cantrip. A session is a
summoned entity (ENTITY-5): each prompt is one cast on it, so a follow-up sees
everything before it. The session id *embeds* the entity id
(``session-<hex>`` for ``entity-<hex>``), so the mapping needs no table of its
own: when the cantrip's loom is a file, a session can be loaded again after a
restart of the process (:meth:`SessionHub.get` resumes the entity from its
loom thread, exactly as a supervisor restarts a crashed entity).

Every adapter goes through :meth:`SessionHub.prompt`, which is
``Entity.send`` plus three things an adapter needs: streaming events
(spec 7.5) delivered to the prompt's sink and to any subscriber, refusing a
second prompt while one runs, and :meth:`SessionHub.cancel`. The JSON shapes
of events, results and turns that HTTP and the CLI print live here too.

Issue 24 added three things a client needs under load: idempotency keys
(:mod:`cantrip.protocols.sessions._idempotency`: a repeated prompt returns the recorded
result or joins the running cast), a client's cancel
(:meth:`SessionHub.request_cancel`), and :meth:`SessionHub.shutdown` (a grace
period, then every running cast is cut off with reason ``shutdown``).

A cancel *targets* a prompt (issue 29): the one running (or arriving), or the one
the client names by its Idempotency-Key or by the id the server gave it
(:attr:`Prompt.id`, sent at once in a ``Prompt-Id`` header and a stream's first
event). With nothing running and nothing named it cancels nothing and says so; the
old "sticky" cancel that waited for whichever prompt came next -- and so cut off an
unrelated prompt when it arrived just after the one it meant had ended -- is now
asked for explicitly (``next``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio

from cantrip._approval import Decision, PauseError
from cantrip._cantrip import Cantrip
from cantrip._core import Entity
from cantrip._core._followups import Followups
from cantrip._errors import CantripError, ConstructionError
from cantrip._outcome import CastResult, recorded_cast
from cantrip._redact import get_logger
from cantrip.distributed._work import CWD_TAG
from cantrip.llm._stream import Event
from cantrip.loom._model import Turn, is_runtime_entity
from cantrip.protocols.sessions import _steering as steering
from cantrip.protocols.sessions._backend import ENTITY_PREFIX as ENTITY_PREFIX
from cantrip.protocols.sessions._backend import SESSION_PREFIX as SESSION_PREFIX
from cantrip.protocols.sessions._backend import SessionError as SessionError
from cantrip.protocols.sessions._backend import check_cwd, check_user, same_user
from cantrip.protocols.sessions._backend import entity_id_for as entity_id_for
from cantrip.protocols.sessions._backend import session_id_for as session_id_for
from cantrip.protocols.sessions._budgets import BudgetBook, ServeBudgets
from cantrip.protocols.sessions._hub_cancel import HubCancels
from cantrip.protocols.sessions._idempotency import (
    key_index,
    keyed_prompt_id,
    session_entity_id,
)
from cantrip.protocols.sessions._session import (
    MAX_ARMED_KEYS as MAX_ARMED_KEYS,
)
from cantrip.protocols.sessions._session import (
    MAX_ENDED_PROMPTS,
    Admitted,
    cast_tags,
    key_reused,
    now,
    recorded_tag,
    recorded_user,
)
from cantrip.protocols.sessions._session import (
    Prompt as Prompt,
)
from cantrip.protocols.sessions._session import (
    Session as Session,
)
from cantrip.protocols.sessions._session import (
    Watcher as Watcher,
)
from cantrip.protocols.sessions._session import (
    not_running as not_running,
)
from cantrip.protocols.sessions._shapes import EVENT_TYPES as EVENT_TYPES  # re-exported
from cantrip.protocols.sessions._shapes import event_dict as event_dict
from cantrip.protocols.sessions._shapes import steered as steered
from cantrip.protocols.sessions._shapes import turn_dict as turn_dict

log = get_logger("cantrip.sessions")


class SessionHub(HubCancels):
    """The sessions of one cantrip; every protocol adapter serves through one."""

    def __init__(
        self,
        spell: Cantrip,
        *,
        sticky_cancel_s: float = 5.0,
        max_running: int | None = None,
        budgets: ServeBudgets | None = None,
    ) -> None:
        self.spell = spell
        self.book = BudgetBook(budgets, spell.loom) if budgets and budgets.bounded else None
        """The server's session and token budgets (cantrip.protocols.sessions._budgets)."""
        self.sessions: dict[str, Session] = {}
        self.nursery: trio.Nursery | None = None
        """Lent to every session's entity for its gate providers (MCP sessions), so
        they live across prompts, and for the work its casts leave behind (memory
        consolidation, :attr:`followups`); set by the adapter that runs the hub."""
        self._followups: Followups | None = None
        self.sticky_cancel_s = sticky_cancel_s
        """How long a cancel that found nothing running waits for a prompt to cut off."""
        self.max_running = max_running
        """Prompts that may run at once; more are refused as ``overloaded``."""
        self.running = 0
        self.accepting = True
        """False once shutdown began: new prompts are refused as ``shutting_down``."""
        self._idle = trio.Event()
        self._idle.set()

    @property
    def persistent(self) -> bool:
        """Whether sessions survive the process: the loom is a file."""
        return getattr(self.spell.loom.store, "path", None) is not None

    @property
    def followups(self) -> Followups | None:
        """The sessions' followups (consolidations), supervised in :attr:`nursery`:
        they outlive the prompt that left them, never the hub (:meth:`shutdown`)."""
        if self.nursery is None:
            return None
        if self._followups is None or self._followups.nursery is not self.nursery:
            self._followups = Followups.lent(self.nursery)
        return self._followups

    def cancel_followups(self, reason: str = "shutdown") -> int:
        """Cut off the consolidations still running, each recorded with ``reason``."""
        return self._followups.cancel_all(reason) if self._followups is not None else 0

    async def aclose(self) -> None:
        self.cancel_followups()
        for session in list(self.sessions.values()):
            self.cancel(session)
            await session.entity.aclose()
        self.sessions.clear()

    # -- sessions ----------------------------------------------------------------

    def new(self, user: str | None = None, cwd: str | None = None) -> Session:
        entity = self.spell.summon()
        return self._adopt(session_id_for(entity.id), entity, user, cwd)

    def fork(self, turn_id: str) -> Session:
        """A new session whose entity continues from ``turn_id`` (LOOM-4)."""
        entity = self.spell.fork(turn_id)
        return self._adopt(session_id_for(entity.id), entity)

    def create(
        self, key: str | None = None, user: str | None = None, cwd: str | None = None
    ) -> tuple[Session, bool]:
        """A new session, or with an idempotency key the session that key created
        (live, or resumed from the loom); the flag says whether it is new. ``user``:
        the ``user`` tag of its casts (:func:`check_user`, :func:`same_user`); ``cwd``
        their ``cwd`` tag (:func:`check_cwd`)."""
        check_user(user)
        check_cwd(cwd)
        if key is None:
            return self.new(user, cwd), True
        entity_id = session_entity_id(key)
        session_id = session_id_for(entity_id)
        if session_id in self.sessions or entity_id in self.spell.loom.entities:
            found = self.get(session_id)
            same_user(found.id, found.user, user)
            return found, False
        entity = self.spell.summon(entity_id=entity_id)
        return self._adopt(session_id, entity, user, cwd), True

    def recorded(self, session_id: str) -> str:
        """The entity of a session the loom holds (``not_found`` for none: a child
        entity or one of the runtime's own is no session)."""
        entity_id = entity_id_for(session_id)
        record = self.spell.loom.entities.get(entity_id)
        if (
            record is None
            or record.parent_entity_id is not None
            or is_runtime_entity(record.cantrip_id)
        ):
            raise SessionError("not_found", f"unknown session {session_id!r}")
        return entity_id

    def get(self, session_id: str) -> Session:
        """A live session, or one resumed from the loom (after a restart)."""
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        entity_id = self.recorded(session_id)
        canonical = session_id_for(entity_id)
        if canonical in self.sessions:
            return self.sessions[canonical]
        log.info("session %s resumed from the loom", canonical)
        entity = self.spell.resume(entity_id)
        turns = entity.turns
        return self._adopt(canonical, entity, recorded_user(turns), recorded_tag(turns, CWD_TAG))

    def only(self) -> Session:
        """The one live session (clients that leave out the session id)."""
        if len(self.sessions) != 1:
            raise SessionError(
                "not_found", f"a session id is required (there are {len(self.sessions)})"
            )
        return next(iter(self.sessions.values()))

    def _adopt(
        self, session_id: str, entity: Entity, user: str | None = None, cwd: str | None = None
    ) -> Session:
        session = Session(session_id, entity, user, cwd=cwd, last_used=now())
        session.log.begin(entity.turns)  # ids go on from the loom's present
        entity.on_event = session.dispatch
        entity.provider_nursery = self.nursery
        entity.followups = self.followups
        if self.book is not None:
            entity.spends_under = self.book.account(entity.id)
        self.sessions[session_id] = session
        return session

    def history(self, session: Session) -> list[Turn]:
        """The session's thread, root to its latest turn (earlier casts included)."""
        leaf = session.entity.leaf
        return self.spell.loom.thread(leaf) if leaf is not None else []

    # -- prompts -----------------------------------------------------------------

    def replay(self, session: Session, intent: str, key: str) -> CastResult | None:
        """The recorded result of the cast ``key`` started on this session, if any."""
        if session.keys is None:
            session.keys = key_index(session.entity.turns)
        start = session.keys.get(key)
        if start is None:
            return None
        # from the cast's first turn on: a range read, not the session's whole history
        turns = self.spell.loom.entity_turns_from(session.entity.id, start)
        if turns[0].intent != intent:
            raise SessionError(
                "key_reused",
                f"Idempotency-Key {key!r} was used for a different prompt on this session",
            )
        return recorded_cast(turns, 0, self.spell.loom)

    def _first_turn_since(self, session: Session, before: str | None) -> str | None:
        """The id of the first turn the session's entity wrote after ``before`` (its
        leaf then), walking back from its leaf now: O(the turns of that cast)."""
        loom, turn_id = self.spell.loom, session.entity.leaf
        first = None
        while turn_id is not None and turn_id != before:
            turn = loom.get(turn_id)
            if turn.entity_id != session.entity.id:
                break
            first, turn_id = turn_id, turn.parent_id
        return first

    async def prompt(
        self,
        session: Session,
        intent: str,
        on_event: Callable[[Event], None] | None = None,
        *,
        key: str | None = None,
        on_busy: str = "reject",
        handle: Prompt | None = None,
    ) -> CastResult | None:
        """One cast on the session's entity; ``None`` if it was cancelled before it
        produced a result: :meth:`admit`, then :meth:`run`.

        A second prompt while one runs (double-texting) follows
        ``on_busy``: ``reject`` ("busy"), ``enqueue`` (it runs when the running one
        has ended), ``interrupt`` (the running cast is cancelled -- recorded, reason
        ``interrupted`` -- and this one runs with both in the history) or ``rollback``
        (the same, then this one continues from before the cancelled cast, whose
        turns stay in the loom as a branch). ``handle`` is the prompt as registered
        when its request arrived (its id was handed out; a cancel may have named it
        meanwhile, and one that names it while it waits its turn is kept).

        With an idempotency ``key`` that this session has seen, nothing is cast
        again: the recorded result comes back, or, while that cast runs, its
        result once it ends. The key is recorded with the cast's first turn.

        A runtime crash of the entity (not a gate failure, not an LLM error) is
        raised to the caller, and the session's entity is resumed from the loom
        -- what a supervisor does for a crashed child."""
        admitted = self.admit(session, intent, key=key, on_busy=on_busy, handle=handle)
        return await self.run(session, admitted, on_event)

    def admit(
        self,
        session: Session,
        intent: str,
        *,
        key: str | None = None,
        on_busy: str = "reject",
        handle: Prompt | None = None,
    ) -> Admitted:
        """Every refusal of a prompt, decided at once (no checkpoint): ``key_reused``,
        ``busy`` (``reject`` while one runs or waits), an unknown policy,
        ``shutting_down``. What it returns says what :meth:`run` does: join the running
        prompt with this key, replay the recorded one, or cast -- the prompt is in the
        session's line from now, so a prompt admitted after it is ``busy`` or waits
        behind it, whenever either's :meth:`run` begins."""
        if key is not None:
            open_ = [p for p in (session.current, *session.waiting) if p is not None]
            same = next((p for p in open_ if p.key == key), None)  # running, or in line
            if same is not None:
                if same.intent != intent:
                    raise key_reused(key)
                if handle is not None:
                    handle.id = same.id  # this request is that prompt
                return Admitted(same, "join")
            if key in session.unstarted:  # cut off before it started: nothing to replay
                if session.unstarted[key] != intent:
                    raise key_reused(key)
                return Admitted(handle or Prompt(intent, key), "replay")
            recorded = self.replay(session, intent, key)
            if recorded is not None:
                return Admitted(handle or Prompt(intent, key), "replay", recorded)
        if handle is None:
            handle = Prompt(intent, key)
            if key is not None:
                handle.id = keyed_prompt_id(session.entity_id, key)
        prompt = handle
        prompt.intent, prompt.key = intent, key
        busy = session.running is not None or bool(session.waiting)
        if busy and on_busy == "reject":
            raise SessionError("busy", f"session {session.id} is already running a prompt")
        if on_busy not in ("reject", "enqueue", "interrupt", "rollback"):
            raise ValueError(f"unknown on_busy policy {on_busy!r}")
        if not self.accepting:
            raise SessionError("shutting_down", "the server is shutting down")
        prompt.waiting = busy
        session.waiting.append(prompt)  # in line from now (FIFO)
        return Admitted(prompt, "cast", on_busy=on_busy)

    async def run(
        self,
        session: Session,
        admitted: Admitted,
        on_event: Callable[[Event], None] | None = None,
    ) -> CastResult | None:
        """Carry out what :meth:`admit` decided: wait for the joined prompt, return the
        replayed result, or wait the prompt's turn and cast it."""
        prompt = admitted.prompt
        if admitted.action == "join":
            await prompt.done.wait()
            if prompt.error is not None:
                raise prompt.error
            return prompt.outcome
        if admitted.action == "replay":
            return admitted.recorded
        key, intent = prompt.key, prompt.intent
        await self._make_way(session, admitted.on_busy, prompt)  # (a cancel may name it)
        # it leaves the line here and runs with no checkpoint between: no waiter
        # behind it can start first
        self._leave_line(session, prompt)
        if session.cancel_until is not None:
            if trio.current_time() <= session.cancel_until:
                prompt.cancel_requested = True  # the cancel of the next prompt: this one
            session.cancel_until = None
        if prompt in session.arriving:
            session.arriving.remove(prompt)  # it starts: a cancel now finds it running
        armed = session.armed_keys.pop(key, None) if key is not None else None
        if armed is not None and trio.current_time() <= armed:
            prompt.cancel_requested = True  # a cancel named this key before it arrived
        if prompt.cancel_requested:
            self._withdraw(session, prompt)
            return None
        if not self.accepting:
            raise SessionError("shutting_down", "the server is shutting down")
        if self.max_running is not None and self.running >= self.max_running:
            raise SessionError(
                "overloaded", f"{self.running} prompts are running (the limit); try again"
            )
        try:  # the client's tools: this prompt's own, none of an earlier prompt's
            session.entity.offer(prompt.offered)
        except ConstructionError as exc:  # a name the circle (an MCP server) has
            raise SessionError("bad_tools", str(exc)) from None
        outcome: CastResult | None = None
        before = session.entity.leaf  # the cast's first turn, if it writes one, follows it
        prompt.before = before
        session.current = prompt
        self.running += 1
        self._idle = trio.Event() if self.running == 1 else self._idle
        with trio.CancelScope() as scope:
            session.running = scope
            session.sink = on_event
            session.steered = (0, 0)
            try:
                outcome = await session.entity.send(
                    intent, tags=cast_tags(key, session.user, session.cwd)
                )
            except CantripError:
                raise
            except Exception as exc:
                prompt.error = exc
                log.exception("session %s: the entity crashed; resuming it", session.id)
                crashed = session.entity
                session.entity = self.spell.resume(crashed.id)
                session.entity.on_event = session.dispatch
                session.entity.provider_nursery = self.nursery
                session.entity.followups = self.followups
                session.entity.spends_under = crashed.spends_under
                with trio.CancelScope(shield=True):
                    await crashed.aclose()
                raise
            finally:
                session.running = None
                session.sink = None
                session.current = None
                if key is not None and session.keys is not None:
                    first = self._first_turn_since(session, before)
                    if first is not None:  # the cast wrote a turn
                        session.keys.setdefault(key, first)
                prompt.outcome = outcome
                prompt.done.set()
                session.prompt_ended(prompt)
                self.running -= 1
                if self.running == 0:
                    self._idle.set()
        return outcome

    def _withdraw(self, session: Session, prompt: Prompt) -> None:
        """End ``prompt``, cut off before it started, with nothing recorded (``None``: a
        cast cancelled before its first turn): a cancel took it back, so its intent
        reaches neither the loom nor a later prompt's model -- as on PostgreSQL, where
        its work item is cancelled as it waits. Its key is remembered (bounded, like
        the ended ids): a repeat replays ``None``, a cancel naming it is ``ended``."""
        if prompt.key is not None:
            session.unstarted.pop(prompt.key, None)
            session.unstarted[prompt.key] = prompt.intent
            while len(session.unstarted) > MAX_ENDED_PROMPTS:
                del session.unstarted[next(iter(session.unstarted))]
        prompt.done.set()
        session.prompt_ended(prompt)
        log.info("session %s: prompt %s cut off before it started", session.id, prompt.id)

    async def _make_way(self, session: Session, on_busy: str, prompt: Prompt) -> None:
        """Double-texting: what a prompt in line does about the one running (see
        :meth:`prompt`). Returns once the session is free and ``prompt`` is first in
        line: waiters are served in the order they came (``Session.waiting``), not the
        first to wake (at once for a prompt alone in line)."""
        rewind_to: list[str | None] = []
        if prompt not in session.waiting:
            session.waiting.append(prompt)
        try:
            while session.running is not None or session.waiting[0] is not prompt:
                current = session.current
                if current is None:  # free, but a prompt before this one goes first
                    await session.turn.wait()
                    continue
                if on_busy != "enqueue" and not rewind_to:
                    rewind_to.append(current.before)
                    self.cancel(session, "interrupted")
                await current.done.wait()
            if on_busy == "rollback" and rewind_to:
                await session.entity.rewind(rewind_to[0])  # still first in line
        except BaseException:
            self._leave_line(session, prompt)
            raise

    def _leave_line(self, session: Session, prompt: Prompt) -> None:
        """``prompt`` waits its turn no more (it starts, or gave up): the next may go."""
        if prompt in session.waiting:
            session.waiting.remove(prompt)
            session.turn.set()
            session.turn = trio.Event()

    def steer(self, session: Session, text: str) -> dict[str, Any]:
        """A message for the session's running prompt (``Entity.steer``), within what
        one cast takes (:mod:`._steering`: ``steering_full`` beyond it). The check and
        the append run with no checkpoint between them, so nothing interleaves."""
        if session.running is None:
            raise not_running(session.id)
        count, size = session.steered
        why = steering.refusal(count, size, text)
        if why is not None:
            raise SessionError(steering.FULL, why)
        if not session.entity.steer(text):
            raise not_running(session.id)
        session.steered = (count + 1, size + steering.size_of(text))
        return steered()

    async def answer(
        self,
        session: Session,
        pause_id: str,
        decision: Decision | Mapping[str, Any],
        on_event: Callable[[Event], None] | None = None,
        *,
        handle: Prompt | None = None,
    ) -> CastResult | None:
        """Answer a pause of the session's entity (``Entity.answer``).

        A pause the loom holds (the prompt returned ``paused``, or the server
        restarted) is continued here like a prompt -- it is one (``handle``, or a new
        :class:`Prompt`): the session's current prompt while it runs, so a cancel,
        named by its id or not, cuts it off, a prompt ``enqueue``-d waits for it, as
        on PostgreSQL where it is a work item. The same turn goes on from the call
        that paused, and its cast's result is returned. A pause a running prompt
        waits on is handed the decision (``None`` is returned: that prompt answers).
        A pause already answered, or unknown, is a :class:`PauseError` -- also while
        its answer is being carried out (checked before ``busy``)."""
        if any(w.pause_id == pause_id for w in session.entity.pending) and (
            session.running is not None
        ):
            return await session.entity.answer(pause_id, decision)  # a live waiter
        if session.answering == pause_id:  # the pause before busy: as on --db
            raise PauseError(f"pause {pause_id} was already answered")
        if session.running is not None:
            raise SessionError("busy", f"session {session.id} is already running a prompt")
        if not self.accepting:
            raise SessionError("shutting_down", "the server is shutting down")
        prompt = Prompt("", None) if handle is None else handle
        prompt.before = session.entity.leaf
        outcome: CastResult | None = None
        session.current = prompt
        self.running += 1
        self._idle = trio.Event() if self.running == 1 else self._idle
        with trio.CancelScope() as scope:
            session.running = scope
            session.sink = on_event
            session.steered = (0, 0)
            session.answering = pause_id
            try:
                outcome = await session.entity.answer(pause_id, decision)
            finally:
                session.running = None
                session.sink = None
                session.answering = None
                session.current = None
                prompt.outcome = outcome
                prompt.done.set()
                session.prompt_ended(prompt)
                self.running -= 1
                if self.running == 0:
                    self._idle.set()
        return outcome  # None: cancelled before the continuation produced a result

    async def shutdown(self, grace_s: float) -> int:
        """Stop taking prompts; let running casts finish for ``grace_s``, then cut
        them off with reason ``shutdown``, and the consolidations still running with
        them (recorded so). Returns how many casts were cut off."""
        self.accepting = False
        with trio.move_on_after(grace_s):
            await self._idle.wait()
        cut = 0
        for session in list(self.sessions.values()):
            if self.cancel(session, "shutdown"):
                cut += 1
        if cut:
            log.info("shutdown: %d running prompt(s) cut off after %.1f s", cut, grace_s)
        await self._idle.wait()
        cut_followups = self.cancel_followups("shutdown")
        if cut_followups:
            log.info("shutdown: %d consolidation(s) cut off", cut_followups)
        return cut
