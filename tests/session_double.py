"""A third session backend for the contract suite: everything in memory, no entity, no
LLM client -- it passes tests/test_session_backend_contract.py by implementing
:class:`~cantrip.protocols.sessions.SessionBackend` alone.

A "cast" here is a loop over :func:`seam_llm.decide` (the rule the loopback model
answers with), each step a recorded :class:`~cantrip.loom._model.Turn`; what a backend
must do about busy sessions, keys, steering, cancels and pauses is written here from
the seam's docstrings, not taken from either real backend.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import trio
from seam_llm import HOLD, Holds, decide, is_last

from cantrip._approval import Decision, Pause, PauseError
from cantrip._client_gates import TOOL_NAME
from cantrip._outcome import CastResult, cast_result, result_dict
from cantrip.llm._contract import ToolCall
from cantrip.loom import Loom
from cantrip.loom._model import EntityRecord, GateCallRecord, Turn
from cantrip.protocols.sessions import (
    MAX_TASKS,
    BusyPolicy,
    Cancelled,
    Capabilities,
    EventId,
    Health,
    PromptOutcome,
    SessionEvent,
    SessionInfo,
    SessionRef,
    SessionSummary,
    Submitted,
    TaskRecord,
    session_id_of,
)
from cantrip.protocols.sessions._backend import check_cwd, check_user, same_user
from cantrip.protocols.sessions._hub import SessionError
from cantrip.protocols.sessions._summaries import summaries_in
from cantrip.protocols.sessions._watches import Watches

STICKY_S = 5.0
T = TypeVar("T")
_ids = itertools.count(1)


def _id(prefix: str) -> str:
    return f"{prefix}-{next(_ids):08d}"


@attrs.define(eq=False)
class _Prompt:
    id: str
    intent: str | None
    key: str | None
    answer: tuple[Pause, str] | None = None
    """A continuation: the pause it answers and the answer's text."""
    done: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    cancel_reason: str | None = None
    before: Turn | None = None
    inbox: list[str] = attrs.field(factory=list)
    cast: CastResult | None = None
    undelivered: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    """The names of the client's tools its cast is offered."""
    ended_at: float = 0.0
    enders: list[trio.MemorySendChannel[SessionEvent]] = attrs.field(factory=list)
    """Followers that end with this prompt (closed once it has ended)."""
    told: list[SessionEvent] = attrs.field(factory=list)
    """Its events, for a follower of this prompt (from its beginning)."""


@attrs.define(eq=False)
class _Task:
    task_id: str
    session: _Session
    prompt: _Prompt
    messages: list[str]
    seq: int
    canceled: bool = False
    changed: float = attrs.field(factory=time.time)


@attrs.define(eq=False)
class _Session:
    id: str
    entity_id: str
    user: str | None = None
    cwd: str | None = None
    turns: list[Turn] = attrs.field(factory=list)
    leaf: Turn | None = None
    queue: list[_Prompt] = attrs.field(factory=list)
    """Open prompts in order; the first runs once ``running`` is set."""
    running: _Prompt | None = None
    prompts: dict[str, _Prompt] = attrs.field(factory=dict)
    keys: dict[str, _Prompt] = attrs.field(factory=dict)
    armed: dict[str, float] = attrs.field(factory=dict)
    next_until: float | None = None
    pending: dict[str, Pause] = attrs.field(factory=dict)
    answered: set[str] = attrs.field(factory=set)
    watchers: list[trio.MemorySendChannel[SessionEvent]] = attrs.field(factory=list)
    log: list[SessionEvent] = attrs.field(factory=list)
    """Every event told, with its id."""
    changed: trio.Event = attrs.field(factory=trio.Event)

    def thread(self) -> list[Turn]:
        by_id = {t.id: t for t in self.turns}
        out, turn = [], self.leaf
        while turn is not None:
            out.append(turn)
            turn = by_id.get(turn.parent_id) if turn.parent_id else None
        return out[::-1]

    def tell(self, event: SessionEvent, prompt: _Prompt | None = None) -> None:
        """Stamp the event with its id (a turn's step at ``<position>.0``, the rest
        counted on from the last) and keep it: this double keeps every event."""
        last = self.log[-1].id if self.log else EventId(0, -1)
        assert last is not None
        told_id = EventId(event.position, 0) if event.position is not None else last.next()
        event = attrs.evolve(event, id=told_id)
        self.log.append(event)
        if prompt is not None:
            prompt.told.append(event)
        self.poke()
        for channel in list(self.watchers):
            try:
                channel.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.watchers.remove(channel)

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


def _conversation(thread: list[Turn], new_users: list[str]) -> tuple[str, int, int, list[str]]:
    """What the model is shown: (latest user message, its answers since, user messages,
    call results since)."""
    prompt, steps, users = "", 0, 0
    told: list[str] = []
    for turn in thread:
        said = [turn.intent] if turn.intent else []
        for user in [*said, *turn.extras.get("steering", ())]:
            prompt, steps, users, told = user, 0, users + 1, []
        told += list(turn.extras.get("told", ()))
        steps += 1
    for user in new_users:
        prompt, steps, users, told = user, 0, users + 1, []
    return prompt, steps, users, told


class DoubleBackend:
    """The in-memory :class:`SessionBackend`."""

    def __init__(self, holds: Holds, nursery: trio.Nursery) -> None:
        self.holds = holds
        self.nursery = nursery
        self._sessions: dict[str, _Session] = {}
        self._tasks: dict[str, _Task] = {}
        self.loom = Loom()
        """Every session's turns, as a loom (what ``read_loom`` reads)."""
        self.watches = Watches()
        self.answers: dict[tuple[str, str], tuple[str, Decision]] = {}
        """(session, pause) -> the continuation its answer started, and the answer."""
        """Runs following prompts for their clients (the rule is the package's)."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, holds: Holds) -> AsyncIterator[DoubleBackend]:
        async with trio.open_nursery() as nursery:
            yield cls(holds, nursery)
            nursery.cancel_scope.cancel()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities("double", False, False, False, True, False)

    def _get(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError("not_found", f"unknown session {session_id!r}")
        return session

    @staticmethod
    def _info(s: _Session) -> SessionInfo:
        return SessionInfo(s.id, s.entity_id, bool(s.queue), len(s.turns), s.user, s.cwd)

    async def create(
        self, key: str | None = None, *, user: str | None = None, cwd: str | None = None
    ) -> tuple[SessionInfo, bool]:
        check_user(user)
        check_cwd(cwd)
        suffix = f"key{abs(hash(key)):016x}" if key is not None else _id("s")
        sid = f"session-{suffix}"
        if sid in self._sessions:
            same_user(sid, self._sessions[sid].user, user)
            return self._info(self._sessions[sid]), False
        session = self._sessions[sid] = _Session(sid, f"entity-{suffix}", user=user, cwd=cwd)
        self.loom.register_entity(EntityRecord(session.entity_id, "double"))
        return self._info(session), True

    async def sessions(self) -> list[SessionInfo]:
        return [self._info(s) for s in self._sessions.values()]

    async def find(self, session_id: str) -> SessionInfo:
        return self._info(self._get(session_id))

    async def summaries(self) -> list[SessionSummary]:
        return summaries_in(self.loom)

    async def thread(self, ref: SessionRef) -> list[Turn]:
        return self._get(session_id_of(ref)).thread()

    async def read_loom(self, read: Callable[[Loom], T]) -> T:
        return read(self.loom)

    async def release(self, session_id: str) -> None:
        return None  # everything the double has is its memory: nothing to let go of

    async def delete(self, session_id: str) -> None:
        self._get(session_id)  # not_found first
        raise SessionError("unsupported", "the double's loom is in memory: it deletes nothing")

    async def fork(self, turn_id: str) -> SessionInfo:
        raise SessionError("unsupported", "the double does not fork (capabilities.viewer_fork)")

    async def shutdown(self, grace_s: float) -> None:
        open_prompts = [p for s in self._sessions.values() for p in s.queue]
        with trio.move_on_after(grace_s):
            for prompt in open_prompts:
                await prompt.done.wait()
        for prompt in open_prompts:
            self._cut(prompt, "shutdown")
        for prompt in open_prompts:
            await prompt.done.wait()

    async def health(self) -> Health:
        running = sum(1 for s in self._sessions.values() if s.running is not None)
        return Health("double", running, len(self._sessions), False)

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
        session = self._get(session_id_of(ref))
        names = tuple(str(t.get("name", "")) for t in tools)
        if len(set(names)) < len(names) or not all(TOOL_NAME.fullmatch(n) for n in names):
            raise SessionError("bad_tools", f"the client's tools are not usable: {names}")
        if key is not None and key in session.keys:
            seen = session.keys[key]
            if seen.intent != intent:
                raise SessionError("key_reused", f"key {key!r} was used for another prompt")
            return Submitted(seen.id, session.id, replayed=True)
        if session.queue:
            if on_busy == "reject":
                raise SessionError("busy", f"session {session.id} is running a prompt")
            if on_busy in ("interrupt", "rollback"):
                current = session.queue[0]
                self._cut(current, "interrupted")
        prompt = _Prompt(_id("prompt"), intent, key, tools=names)
        rollback = on_busy == "rollback" and bool(session.queue)
        if rollback:
            prompt.before = session.queue[0].before  # where the cut-off prompt began
        now = trio.current_time()
        if session.next_until is not None:
            if now <= session.next_until:
                prompt.cancel_reason = "cancelled"
            session.next_until = None
        if key is not None:
            until = session.armed.pop(key, None)
            if until is not None and now <= until:
                prompt.cancel_reason = "cancelled"
            session.keys[key] = prompt
        self._open(session, prompt, rollback=rollback)
        return Submitted(prompt.id, session.id)

    def _open(self, session: _Session, prompt: _Prompt, *, rollback: bool = False) -> None:
        session.prompts[prompt.id] = prompt
        session.queue.append(prompt)
        self.nursery.start_soon(self._run, session, prompt, rollback)

    def _cut(self, prompt: _Prompt, reason: str) -> None:
        prompt.cancel_reason = prompt.cancel_reason or reason
        prompt.scope.cancel()

    async def _run(self, session: _Session, prompt: _Prompt, rollback: bool) -> None:
        try:
            while session.queue[0] is not prompt:
                await session.changed.wait()
            session.running = prompt
            if rollback:
                session.leaf = prompt.before
            prompt.before = session.leaf
            if prompt.cancel_reason is None:
                with prompt.scope:
                    await self._cast(session, prompt)
            mine = [t for t in session.turns if t.extras.get("prompt") == prompt.id]
            pending = [p for p in session.pending.values() if p.pause_id.startswith(prompt.id)]
            if mine or pending:
                cast = cast_result(
                    mine, entity_id=session.entity_id, cost_usd=None, pending=pending
                )
                prompt.undelivered = tuple(prompt.inbox)
                prompt.cast = attrs.evolve(cast, undelivered=prompt.undelivered)
            else:
                prompt.undelivered = tuple(prompt.inbox)
        finally:
            session.queue.remove(prompt)
            session.running = None
            prompt.ended_at = time.time()
            prompt.done.set()
            for ender in prompt.enders:
                ender.close()
            session.poke()

    async def _cast(self, session: _Session, prompt: _Prompt) -> None:
        first = True
        while True:
            taken, prompt.inbox[:] = list(prompt.inbox), []
            said = [prompt.intent] if first and prompt.intent is not None else []
            told = [prompt.answer[1]] if first and prompt.answer is not None else []
            latest, steps, users, results = _conversation(session.thread(), said + taken)
            results = results + told
            hold = HOLD.search(latest)
            try:
                if hold is not None and is_last(latest, steps):
                    await self.holds.at(hold.group(1))
                await trio.sleep(0)  # the model's call
            except trio.Cancelled:
                self._record(session, prompt, first, said, taken, told, cut=True)
                raise
            gate, arguments = decide(latest, steps, users, results, prompt.tools)
            turn = self._record(
                session, prompt, first, said, taken, told, gate=gate, arguments=arguments
            )
            first = False
            if turn.terminated:
                return
            if gate == "ask_user" or gate in prompt.tools:  # the client's: a question too
                pause = Pause(
                    pause_id=f"{prompt.id}-pause",
                    entity_id=session.entity_id,
                    kind="question",
                    gate=gate,
                    args=arguments,
                    question=arguments.get("question", f"the client runs {gate}"),
                    checkpoint_id=turn.id,
                    tool_call_id=turn.tool_calls[0].id,
                )
                session.pending[pause.pause_id] = pause
                data = {"type": "pause", "entity_id": session.entity_id, "pause": pause.to_dict()}
                session.tell(SessionEvent("pause", data), prompt)
                return

    def _record(
        self,
        session: _Session,
        prompt: _Prompt,
        first: bool,
        said: list[str],
        taken: list[str],
        told: list[str],
        *,
        cut: bool = False,
        gate: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> Turn:
        extras: dict[str, Any] = {"prompt": prompt.id}
        if first and session.user is not None:
            extras["user"] = session.user  # the cast's tags, on its first turn
        if first and session.cwd is not None:
            extras["cwd"] = session.cwd
        if taken:
            extras["steering"] = taken
        if told:
            extras["told"] = told
        done = gate == "done"
        answered = prompt.answer if first and told else None  # the call the answer completes
        calls: tuple[GateCallRecord, ...] = (
            ()
            if answered is None
            else (
                GateCallRecord(
                    answered[0].gate,
                    answered[0].args,
                    answered[1],
                    tool_call_id=answered[0].tool_call_id,
                ),
            )
        )
        turn_id = _id("turn")
        call = None if cut else ToolCall(id=f"{turn_id}-call", name=gate, arguments=arguments or {})
        if call is not None and gate in ("echo", "done"):  # ran here; the others wait
            result = (arguments or {}).get("text" if gate == "echo" else "answer")
            calls += (GateCallRecord(gate, arguments or {}, result, tool_call_id=call.id),)
        turn = Turn(
            id=turn_id,
            parent_id=session.leaf.id if session.leaf is not None else None,
            entity_id=session.entity_id,
            sequence=(session.leaf.sequence if session.leaf is not None else 0) + 1,
            intent=said[0] if said else None,
            utterance=f"{gate}({arguments or {}})",
            terminated=done,
            truncated=cut,
            reason="done" if done else (prompt.cancel_reason or "cancelled") if cut else None,
            result=(arguments or {}).get("answer") if done else None,
            extras=extras,
            tool_calls=(call,) if call is not None else (),
            gate_calls=calls,
        )
        session.turns.append(turn)
        session.leaf = turn
        self.loom.append(turn)
        step = {"type": "step_complete", "entity_id": session.entity_id, **_step(turn)}
        session.tell(SessionEvent("step_complete", step, len(session.turns), turn), prompt)
        if done:
            final = {"type": "final_response", "entity_id": session.entity_id}
            told = SessionEvent("final_response", {**final, "result": turn.result})
            session.tell(told, prompt)
        return turn

    async def result(self, ref: SessionRef, prompt_id: str) -> PromptOutcome:
        session = self._get(session_id := session_id_of(ref))
        prompt = session.prompts.get(prompt_id)
        if prompt is None:
            raise SessionError("not_found", f"no prompt {prompt_id!r} of session {session_id}")
        await prompt.done.wait()
        return PromptOutcome(prompt.id, prompt.cast, prompt.undelivered)

    async def steer(self, session_id: str, text: str) -> None:
        session = self._get(session_id)
        if not session.queue:
            raise SessionError("not_running", f"session {session_id} is not running a prompt")
        session.queue[0].inbox.append(text.strip())

    async def cancel(
        self,
        session_id: str,
        *,
        prompt_id: str | None = None,
        key: str | None = None,
        next_prompt: bool = False,
    ) -> Cancelled:
        session = self._get(session_id)
        named = prompt_id is not None or key is not None
        if key is not None and key not in session.keys and prompt_id is None:
            session.armed[key] = trio.current_time() + STICKY_S
            return Cancelled(False, "next", idempotency_key=key, sticky_s=STICKY_S)
        wanted = session.keys[key] if key is not None else None
        if prompt_id is not None:
            wanted = session.prompts.get(prompt_id)
        if named and wanted is None:
            return Cancelled(False, "none", prompt_id=prompt_id, idempotency_key=key)
        hit = wanted if named else (session.queue[0] if session.queue else None)
        if hit is None:
            if not next_prompt:
                return Cancelled(False, "none")
            session.next_until = trio.current_time() + STICKY_S
            return Cancelled(False, "next", sticky_s=STICKY_S)
        if hit not in session.queue:
            return Cancelled(False, "ended", prompt_id=hit.id, idempotency_key=hit.key)
        self._cut(hit, "cancelled")
        if session.running is hit:
            return Cancelled(True, "running", hit.id, hit.key, hit.intent)
        return Cancelled(True, "queued", hit.id, hit.key, hit.intent)

    # -- pauses ------------------------------------------------------------------

    async def pauses(self, ref: SessionRef) -> list[Pause]:
        return list(self._get(session_id_of(ref)).pending.values())

    async def answer(
        self, session_id: str, pause_id: str, decision: Decision, *, repeat: bool = False
    ) -> Submitted | None:
        session = self._get(session_id)
        again = self.answers.get((session_id, pause_id)) if repeat else None
        if again is not None and again[1] == decision:
            return Submitted(again[0], session.id, replayed=True)
        if pause_id in session.answered:
            raise PauseError(f"pause {pause_id} was already answered")
        pause = session.pending.get(pause_id)
        if pause is None:
            raise PauseError(f"no pause {pause_id!r} is waiting")
        if (pause.kind == "question") != (decision.kind == "answer"):
            wanted = "an answer" if pause.kind == "question" else "a decision"
            raise PauseError(f"pause {pause_id} takes {wanted}")
        del session.pending[pause_id]
        session.answered.add(pause_id)
        paused = session.prompts.get(pause_id.removesuffix("-pause"))
        offered = paused.tools if paused is not None else ()  # its continuation's too
        prompt = _Prompt(_id("prompt"), None, None, answer=(pause, str(decision.text)))
        prompt.tools = offered
        self._open(session, prompt)
        self.answers[(session_id, pause_id)] = (prompt.id, decision)
        return Submitted(prompt.id, session.id)

    # -- events ------------------------------------------------------------------

    async def follow(
        self,
        ref: SessionRef,
        after: int | EventId = 0,
        *,
        until: str | None = None,
        prompt_id: str | None = None,
    ) -> AsyncGenerator[SessionEvent, None]:
        session = self._get(session_id := session_id_of(ref))
        if prompt_id is not None:
            prompt = session.prompts.get(prompt_id)
            if prompt is None:
                raise SessionError("not_found", f"no prompt {prompt_id!r} of {session_id}")
            sent = 0
            while True:
                changed = session.changed  # before the look: no change is missed
                while sent < len(prompt.told):
                    sent += 1
                    event = prompt.told[sent - 1]
                    if not isinstance(after, EventId) or (
                        event.id is not None and event.id > after
                    ):
                        yield event
                if prompt.done.is_set():
                    return
                await changed.wait()
        if isinstance(after, EventId):
            if after.turn > len(session.turns):
                raise SessionError("bad_request", f"no event {after} in session {session_id}")
            start = after
        else:
            if not 0 <= after <= len(session.turns):
                raise SessionError("bad_request", f"no turn {after} in session {session_id}")
            ids = [e.id for e in session.log if e.id is not None and e.id.turn == after]
            recorded = [i for i in ids if i.index <= int(session.turns[after - 1].terminated)]
            start = max(recorded) if after and recorded else EventId(after, -1)
        send, receive = trio.open_memory_channel[SessionEvent](math.inf)
        session.watchers.append(send)
        if until is not None:
            prompt = session.prompts.get(until)
            if prompt is None:
                send.close()
                raise SessionError("not_found", f"no prompt {until!r} of session {session_id}")
            if prompt.done.is_set():
                send.close()
            else:
                prompt.enders.append(send)
        last = start
        with receive:
            for event in list(session.log):
                if event.id is not None and event.id > last:
                    last = event.id
                    yield event
            async for event in receive:
                if event.id is not None and event.id <= last:
                    continue
                last = event.id or last
                yield event

    # -- tasks -------------------------------------------------------------------

    async def submit_task(
        self,
        session_id: str,
        intent: str,
        *,
        task_id: str,
        message: str,
        on_busy: BusyPolicy = "reject",
    ) -> TaskRecord:
        submitted = await self.submit(session_id, intent, on_busy=on_busy)
        session = self._get(session_id)
        prompt = session.prompts[submitted.prompt_id]
        task = _Task(task_id, session, prompt, [message], next(_ids))
        self._tasks[task_id] = task
        return _task_record(task)

    async def task(self, task_id: str) -> TaskRecord | None:
        task = self._tasks.get(task_id)
        return None if task is None else _task_record(task)

    async def tasks(
        self, session_id: str | None, *, before: int | None = None, limit: int = MAX_TASKS
    ) -> list[TaskRecord]:
        found = sorted(self._tasks.values(), key=lambda t: -t.seq)
        return [
            _task_record(t)
            for t in found
            if (session_id is None or t.session.id == session_id)
            and (before is None or t.seq < before)
        ][:limit]

    async def answer_task(
        self, task_id: str, prompt_id: str, pause_id: str, decision: Decision, message: str
    ) -> TaskRecord | None:
        task = self._tasks.get(task_id)
        if task is None or task.prompt.id != prompt_id or task.canceled:
            return None
        submitted = await self.answer(task.session.id, pause_id, decision)
        if submitted is not None:
            task.prompt = task.session.prompts[submitted.prompt_id]
        task.messages.append(message)
        task.changed = time.time()
        return _task_record(task)

    async def cancel_waiting_task(self, task_id: str, prompt_id: str) -> TaskRecord | None:
        task = self._tasks.get(task_id)
        if task is None or task.prompt.id != prompt_id or task.canceled:
            return None
        task.canceled = True
        task.changed = time.time()
        return _task_record(task)


def _task_record(task: _Task) -> TaskRecord:
    prompt = task.prompt
    ended = prompt.done.is_set()
    return TaskRecord(
        task.task_id,
        task.session.id,
        prompt.id,
        tuple(task.messages),
        task.seq,
        task.canceled,
        max(task.changed, prompt.ended_at),
        "ended" if ended else "open",
        result_dict(prompt.cast) if ended else None,
    )


def _step(turn: Turn) -> dict[str, Any]:
    return {
        "turn_id": turn.id,
        "sequence": turn.sequence,
        "terminated": turn.terminated,
        "truncated": turn.truncated,
        "reason": turn.reason,
    }
