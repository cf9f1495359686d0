"""The in-process session backend: an adapter over :class:`SessionHub` (entities run in
this process, on any loom).

It adds no rule of its own: every refusal, busy policy, idempotency replay and cancel
is the hub's (:mod:`cantrip.protocols.sessions._hub`). What it adds is the seam's shape:
sessions named by id, a prompt accepted at once and awaited apart (the cast runs in
the backend's nursery, as ``HttpApp`` runs it in the server's), results kept by prompt
id, events with positions.

Accepting a prompt at once: ``SessionHub.admit`` decides every refusal (``busy``,
``key_reused``, ``shutting_down``...) with no checkpoint and puts the prompt in its
session's line; ``submit`` raises a refusal to its caller there and then, and runs the
rest (``SessionHub.run``: wait its turn, cast; or join the running prompt with its key,
or replay the recorded one) in the backend's nursery. An answer's continuation is still
started with ``nursery.start`` (``SessionHub.answer`` decides before its first
checkpoint, so its refusal is known when the caller resumes).

What only this mode has, beside the seam: the sessions kept in memory are bounded
(:mod:`cantrip.protocols.sessions._limits`: ``create`` and a session resumed from
the loom make room first, or are refused ``too_many_sessions``), and a prompt request is
known to its session from the moment it arrives (:meth:`ProcessBackend.announce`,
entered by :func:`~cantrip.protocols.middleware._arriving.arrivals` while the body is
read): a cancel meanwhile cuts it off as it starts (``starting``).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

import trio

from cantrip._approval import Decision, Pause, PauseError
from cantrip._cantrip import Cantrip
from cantrip._client_gates import client_gates
from cantrip._errors import CantripError, ConstructionError
from cantrip._gate import Gate
from cantrip._outcome import CastResult
from cantrip._providers import ProviderScope
from cantrip._redact import get_logger, redact
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._retention import prune, retention_of
from cantrip.protocols.sessions._backend import (
    BusyPolicy,
    Cancelled,
    Capabilities,
    Health,
    PromptOutcome,
    SessionEvent,
    SessionInfo,
    SessionRef,
    SessionSummary,
    Submitted,
    check_cwd,
    check_user,
    session_id_of,
)
from cantrip.protocols.sessions._hub import (
    Prompt,
    Session,
    SessionError,
    SessionHub,
)
from cantrip.protocols.sessions._idempotency import keyed_prompt_id
from cantrip.protocols.sessions._limits import SessionLimits, make_room
from cantrip.protocols.sessions._positions import (
    START,
    EventId,
    catch_up,
    cut_event,
    dropped_event,
    reset_event,
    resolve,
)
from cantrip.protocols.sessions._process_tasks import ProcessTasks, Run, Task
from cantrip.protocols.sessions._summaries import summaries_in
from cantrip.protocols.sessions._watches import Watches

log = get_logger("cantrip.sessions")
T = TypeVar("T")

KEPT_RESULTS = 1000
"""Ended prompts whose outcome is kept for :meth:`ProcessBackend.result` (the oldest go)."""


CAPABILITIES = Capabilities(
    mode="process",
    token_events=True,
    a2a_push=True,
    viewer_fork=True,
    durable_prompt_ids=False,
    shared=False,
)
"""What this backend offers (the docs' table of modes is generated from it)."""


_ANNOUNCED: contextvars.ContextVar[Prompt | None] = contextvars.ContextVar(
    "cantrip_announced_prompt", default=None
)
"""The prompt the current request announced (:meth:`ProcessBackend.announce`): its
``submit`` is that prompt (its id handed out, a cancel that found it kept)."""


class ProcessBackend(ProcessTasks):
    """:class:`~cantrip.protocols.sessions.SessionBackend` over a :class:`SessionHub`."""

    def __init__(
        self,
        hub: SessionHub,
        nursery: trio.Nursery | None = None,
        limits: SessionLimits | None = None,
    ) -> None:
        self.hub = hub
        self.nursery = nursery
        """Where casts run: they outlive the request that started them (set by
        :meth:`open` or :meth:`running`; None: a backend that runs none -- reads,
        forks and cancels only)."""
        self.limits = limits
        """How many sessions stay in memory, and how long (None: no bound)."""
        self._runs: dict[str, Run] = {}
        self._tasks: dict[str, Task] = {}
        """The tasks recorded beside prompts (``MAX_TASKS``, the oldest settled go)."""
        self._seq = itertools.count(1)
        self._answers: dict[tuple[str, str], tuple[str, Decision]] = {}
        """(session, pause) -> the continuation an answer started, and the answer (for
        an answer sent again, ``answer(..., repeat=True)``; the latest KEPT_RESULTS)."""
        self.watches = Watches()
        """Runs following prompts for their clients (one process serves them all)."""

    @classmethod
    def serving(
        cls, spell: Cantrip, *, sticky_cancel_s: float = 5.0, limits: SessionLimits | None = None
    ) -> ProcessBackend:
        """A backend for ``spell``'s sessions (run it with :meth:`running`). The hub
        has no ``max_running`` of its own: a server admits prompts in one place
        (:class:`~cantrip.protocols.middleware._lifecycle.Admission`)."""
        hub = SessionHub(
            spell,
            sticky_cancel_s=sticky_cancel_s,
            budgets=limits.budgets if limits is not None else None,
        )
        return cls(hub, limits=limits)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, hub: SessionHub, limits: SessionLimits | None = None
    ) -> AsyncIterator[ProcessBackend]:
        """The backend while the block runs; its casts are cut off and its entities
        closed at the end."""
        backend = cls(hub, limits=limits)
        async with backend.running():
            yield backend

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve while the block runs: the sessions' gate providers (MCP sessions) in a
        nursery of their own, the casts in another (what outlives a request); at the
        end the casts still running are cut off, and the entities close their providers
        before the providers' nursery goes."""
        providers = await ProviderScope.enter()
        self.hub.nursery = providers.nursery
        try:
            async with trio.open_nursery() as casts:
                self.nursery = casts
                try:
                    yield
                finally:
                    casts.cancel_scope.cancel()
                    self.nursery = None
                    with trio.CancelScope(shield=True):
                        await self.hub.aclose()
        finally:
            self.hub.nursery = None
            await providers.aclose()

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking prompts; the running casts get ``grace_s``, then are cut off
        (reason ``shutdown``); returns once none runs."""
        await self.hub.shutdown(grace_s)

    @contextlib.contextmanager
    def announce(self, session_id: str, key: str | None) -> Iterator[None]:
        """A prompt request for the session is arriving (its body is read): until it
        is submitted (or fails) a cancel -- unnamed, or naming its key or the id it
        will have -- cuts it off as it starts (``starting``). Its ``submit`` is to be
        called in the same task (the request's)."""
        session = self.hub.sessions.get(session_id)
        if session is None:  # (one resumed from the loom is not known until found)
            yield
            return
        handle = Prompt("", key)
        if key is not None:
            handle.id = keyed_prompt_id(session.entity_id, key)
        session.arriving.append(handle)
        token = _ANNOUNCED.set(handle)
        try:
            yield
        finally:
            _ANNOUNCED.reset(token)
            if handle in session.arriving and not handle.submitted:
                session.arriving.remove(handle)

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    # -- sessions ----------------------------------------------------------------

    async def make_room(self, *, adding: bool) -> None:
        """Drop sessions idle too long; with ``adding``, make room for one more
        (``too_many_sessions`` if every one in memory is busy)."""
        if self.limits is None:
            return
        try:
            await make_room(self.hub, self.limits, adding=adding)
        except SessionError as exc:  # full
            raise SessionError("too_many_sessions", exc.message) from None

    async def _session(self, session_id: str) -> Session:
        await self.make_room(adding=session_id not in self.hub.sessions)
        session = self.hub.get(session_id)  # not_found, or resumed from the loom
        with contextlib.suppress(RuntimeError):
            session.last_used = trio.current_time()
        return session

    async def create(
        self, key: str | None = None, *, user: str | None = None, cwd: str | None = None
    ) -> tuple[SessionInfo, bool]:
        check_user(user)  # before making room for it
        check_cwd(cwd)
        await self.make_room(adding=True)
        session, created = self.hub.create(key, user, cwd)
        return _info(session), created

    async def sessions(self) -> list[SessionInfo]:
        return [_info(s) for s in self.hub.sessions.values()]

    async def find(self, session_id: str) -> SessionInfo:
        return _info(await self._session(session_id))

    async def summaries(self) -> list[SessionSummary]:
        return summaries_in(self.hub.spell.loom)  # in memory, or a local file: at once

    async def thread(self, ref: SessionRef) -> list[Turn]:
        return self.hub.history(await self._session(session_id_of(ref)))

    async def read_loom(self, read: Callable[[Loom], T]) -> T:
        return read(self.hub.spell.loom)  # in memory, or a local file: read at once

    async def release(self, session_id: str) -> None:
        session = self.hub.sessions.get(session_id)
        if session is None or session.running is not None or session.arriving:
            return
        if session.waiting or session.watched:
            return
        del self.hub.sessions[session_id]
        with trio.CancelScope(shield=True):
            await session.entity.aclose()  # its providers too; the loom resumes it

    async def delete(self, session_id: str) -> None:
        """Remove the session from memory and its whole tree from the loom (the
        retention rule, :func:`~cantrip.loom._retention.prune`): ``busy`` while a prompt
        of it is open or somebody follows it, ``not_found`` for a session the loom
        lacks, ``unsupported`` for a loom that cannot delete (memory, JSONL),
        ``cannot_delete`` when the rule keeps it (a fork stands on it)."""
        entity_id = self.hub.recorded(session_id)
        loom = self.hub.spell.loom
        try:
            retention_of(loom)
        except CantripError as exc:
            raise SessionError("unsupported", f"this loom cannot delete sessions: {exc}") from None
        session = self.hub.sessions.get(session_id)
        if session is not None:
            if session.running is not None or session.arriving or session.waiting:
                raise SessionError("busy", f"session {session_id} is running a prompt")
            await self.release(session_id)
            if session_id in self.hub.sessions:
                raise SessionError("busy", f"session {session_id} is being followed")
        pruned = prune(loom, entity=entity_id, busy_s=0.0, reclaim=False)
        if entity_id not in pruned.plan.entities:
            why = dict(pruned.plan.kept).get(entity_id, "the retention rule keeps it")
            raise SessionError("cannot_delete", f"session {session_id} stays: {why}")
        loom.forget(pruned.plan.entities)
        for task in [t for t in self._tasks.values() if t.session_id == session_id]:
            del self._tasks[task.task_id]  # a protocol's record of the session goes too

    async def fork(self, turn_id: str) -> SessionInfo:
        if not self.hub.spell.loom.has_turn(turn_id):
            raise SessionError("not_found", f"no turn {turn_id!r} in the loom")
        try:
            session = self.hub.fork(turn_id)
        except CantripError as exc:
            raise SessionError("cannot_fork", redact(str(exc))) from None
        return _info(session)

    # -- prompts -----------------------------------------------------------------

    async def submit(
        self,
        ref: SessionRef,
        intent: str,
        *,
        key: str | None = None,
        on_busy: BusyPolicy = "reject",
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> Submitted:
        session = await self._session(session_id_of(ref))  # (in memory: no read to save)
        if self.nursery is None:
            raise SessionError("shutting_down", "the backend is not running")
        offered = _client_gates(tools)  # bad_tools: refused before anything is made
        handle = _ANNOUNCED.get()
        if handle is None or handle not in session.arriving:
            handle = Prompt(intent, key)
            if key is not None:
                handle.id = keyed_prompt_id(session.entity_id, key)
            session.arriving.append(handle)  # a cancel meanwhile finds it, as HTTP's does
        handle.offered = offered
        handle.submitted = True

        def depart() -> None:
            if handle in session.arriving:
                session.arriving.remove(handle)

        try:  # every refusal, at once: busy, key_reused, shutting_down
            admitted = self.hub.admit(session, intent, key=key, on_busy=on_busy, handle=handle)
        except BaseException:
            depart()
            raise
        prompt_id = admitted.prompt.id
        if admitted.action != "cast":  # a key's replay, or the running prompt joined
            depart()
            if admitted.action == "replay" or prompt_id not in self._runs:
                run = Run(session.id)
                self._keep(prompt_id, run)
                self._spawn(run, lambda: self.hub.run(session, admitted))
            return Submitted(prompt_id, session.id, replayed=True)
        run = Run(session.id)
        self._keep(prompt_id, run)

        async def cast() -> CastResult | None:
            try:
                return await self.hub.run(session, admitted)
            finally:
                depart()

        self._spawn(run, cast)
        return Submitted(prompt_id, session.id)

    def _spawn(self, run: Run, cast: Callable[[], Awaitable[CastResult | None]]) -> None:
        """Run ``cast`` in the backend's nursery, its outcome or error kept in ``run``."""
        assert self.nursery is not None  # (submit checked)
        self.nursery.start_soon(self._carry, run, cast)

    async def _carry(self, run: Run, cast: Callable[[], Awaitable[CastResult | None]]) -> None:
        try:
            run.cast = await cast()
        except (SessionError, CantripError) as exc:  # refused, or failed: told the caller
            run.error = exc
        except Exception as exc:  # the boundary of a cast (the hub resumed the entity)
            log.exception("session %s: the entity crashed", run.session_id)
            run.error = SessionError("crashed", f"the entity crashed: {exc!r}")
        finally:
            run.end()

    async def _start(self, run: Run, cast: Callable[[], Awaitable[CastResult | None]]) -> None:
        """Run ``cast`` in the backend's nursery; return once it has blocked or ended
        (an answer: ``SessionHub.answer`` decides its refusals before its first
        checkpoint, so by then a refusal is in ``run``)."""
        if self.nursery is None:
            raise SessionError("shutting_down", "the backend is not running")

        async def task(task_status: trio.TaskStatus[None]) -> None:
            task_status.started()  # the caller resumes once this task blocks
            await self._carry(run, cast)

        if self.nursery is None:
            raise RuntimeError("this backend has no nursery to run casts in (see open)")
        await self.nursery.start(task)

    def _keep(self, prompt_id: str, run: Run) -> None:
        self._runs[prompt_id] = run
        if len(self._runs) > KEPT_RESULTS:
            for old, kept in list(self._runs.items()):
                if kept.done.is_set():
                    del self._runs[old]
                    break

    async def result(self, ref: SessionRef, prompt_id: str) -> PromptOutcome:
        session = await self._session(session_id_of(ref))
        run = self._runs.get(prompt_id)
        if run is None or run.session_id != session.id:
            raise SessionError(
                "not_found", f"no prompt {prompt_id!r} of session {session.id} is known here"
            )
        if not run.done.is_set():
            await run.done.wait()
        if run.error is not None:
            if isinstance(run.error, SessionError | PauseError):
                raise run.error
            raise SessionError("cast_failed", f"the cast failed: {run.error}") from run.error
        cast = run.cast
        return PromptOutcome(prompt_id, cast, cast.undelivered if cast is not None else ())

    async def steer(self, session_id: str, text: str) -> None:
        self.hub.steer(await self._session(session_id), text.strip())

    async def cancel(
        self,
        session_id: str,
        *,
        prompt_id: str | None = None,
        key: str | None = None,
        next_prompt: bool = False,
    ) -> Cancelled:
        answer = self.hub.request_cancel(
            await self._session(session_id), prompt_id=prompt_id, key=key, next_prompt=next_prompt
        )
        return Cancelled.from_dict(answer)

    # -- pauses ------------------------------------------------------------------

    async def pauses(self, ref: SessionRef) -> list[Pause]:
        return list((await self._session(session_id_of(ref))).entity.pending)

    async def answer(
        self, session_id: str, pause_id: str, decision: Decision, *, repeat: bool = False
    ) -> Submitted | None:
        session = await self._session(session_id)
        if repeat and all(p.pause_id != pause_id for p in session.entity.pending):
            known = self._answers.get((session.id, pause_id))
            if known is not None and known[1] == decision and known[0] in self._runs:
                return Submitted(known[0], session.id, replayed=True)  # this answer, again
            # not open, and not answered so: refused as the pause's, not as ``busy``
            # (a child may be waiting in place on another pause of a running prompt)
            raise PauseError(f"pause {pause_id!r} is not pending (answered, or unknown)")
        run = Run(session.id)
        handle = Prompt("", None)  # the continuation: a prompt a cancel can name
        await self._start(run, lambda: self.hub.answer(session, pause_id, decision, handle=handle))
        if run.done.is_set() and run.error is not None:
            raise run.error  # answered already, unknown, or busy
        if run.done.is_set() and run.cast is None:
            return None  # a running prompt waited on it in place: that prompt answers
        self._keep(handle.id, run)
        self._answers[(session.id, pause_id)] = (handle.id, decision)
        while len(self._answers) > KEPT_RESULTS:
            del self._answers[next(iter(self._answers))]
        return Submitted(handle.id, session.id)

    # -- events ------------------------------------------------------------------

    async def follow(
        self,
        ref: SessionRef,
        after: int | EventId = 0,
        *,
        until: str | None = None,
        prompt_id: str | None = None,
    ) -> AsyncGenerator[SessionEvent, None]:
        session = await self._session(session_id_of(ref))
        if prompt_id is not None:
            resume = after if isinstance(after, EventId) else None
            async with contextlib.aclosing(self._follow_prompt(session, prompt_id, resume)) as own:
                async for told in own:
                    yield told
            return
        run: Run | None = None
        if until is not None:
            run = self._runs.get(until)
            if run is None or run.session_id != session.id:
                raise SessionError("not_found", f"no prompt {until!r} of session {session.id}")
        turns = list(session.entity.turns)
        start = resolve(after, turns)
        watcher = session.watch()  # before the catch-up is read: nothing falls between
        if run is not None:
            if run.done.is_set():
                watcher.close()  # its turns are recorded: told from the loom, then the end
            else:
                run.watchers.append(watcher)
        with watcher.events:
            missing = session.log.missing_after(start)
            if missing is not None:
                yield reset_event(start, missing)
            last = start
            for told in catch_up(turns, start, session.log.held(start)):
                last = told.id or last
                yield told
            async for told in watcher.events:
                if told.id is not None and told.id <= last:
                    continue  # told from the catch-up already
                last = told.id or last
                yield told
            if watcher.dropped:
                yield dropped_event(last)

    async def _follow_prompt(
        self, session: Session, prompt_id: str, after: EventId | None
    ) -> AsyncGenerator[SessionEvent, None]:
        """The events of one prompt's cast until it ends: those before this call
        from the session's log (the cast may have begun before a client follows it),
        after ``after`` when a client resumes, then as they happen."""
        run = self._runs.get(prompt_id)
        if run is None or run.session_id != session.id:
            raise SessionError(
                "not_found", f"no prompt {prompt_id!r} of session {session.id} is known here"
            )
        watcher = session.watch()
        if run.done.is_set():
            watcher.close()
        else:
            run.watchers.append(watcher)
        last = START if after is None else after
        with watcher.events:
            if after is None and prompt_id in session.log.cut:  # its first ones are gone
                held = session.log.events
                yield cut_event(prompt_id, held[0][0].id or START if held else START)
            elif after is not None:
                missing = session.log.missing_after(after)
                if missing is not None:
                    yield reset_event(after, missing)
            for told in session.log.held(last):
                if told.prompt_id == prompt_id:
                    last = told.id or last
                    yield told
            async for told in watcher.events:
                if told.prompt_id != prompt_id or (told.id is not None and told.id <= last):
                    continue
                last = told.id or last
                yield told
            if watcher.dropped:
                yield dropped_event(last)

    async def health(self) -> Health:
        return Health("process", self.hub.running, len(self.hub.sessions), self.hub.persistent)


def _failure(error: BaseException) -> str:
    """Why a prompt failed, for a client (a session's refusal says its kind)."""
    if isinstance(error, SessionError):
        return f"{error.kind}: {error.message}"
    if isinstance(error, PauseError):
        return f"the answer was refused: {error}"
    return f"the cast failed: {error}"


def _client_gates(tools: Sequence[Mapping[str, Any]]) -> tuple[Gate, ...]:
    """The client's tool definitions as the gates the hub offers (``bad_tools``)."""
    try:
        return client_gates(tools)
    except ConstructionError as exc:
        raise SessionError("bad_tools", str(exc)) from None


def _info(session: Session) -> SessionInfo:
    return SessionInfo(
        session.id,
        session.entity_id,
        session.running is not None,
        len(session.entity.turns),
        session.user,
        session.cwd,
    )
