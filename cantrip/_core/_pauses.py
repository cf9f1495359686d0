"""Pauses: calls that wait for a human, and how their answers are carried out.

A call in a circle with an approval policy (or ``ask_user``, or a question an
MCP server asks inside a call) may need a human: the turn in flight is
checkpointed with a ``pending`` marker, the pause is listed and sent to the
event sink, and the entity either waits in place for the answer (``"wait"``,
an ``on_pause`` handler, every child) or leaves the cast ``paused``
(``"return"``, ``"leave"``), to be answered later from the loom -- in this
process or any other. An answer is recorded (``answered``) before it is
carried out, so the gate runs at most once per answer (:mod:`cantrip._approval`
holds the values; this module the mechanism). Going on with the rest of a
paused turn is the loop's (:func:`cantrip._core._loop.continue_paused`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import attrs
import trio

from cantrip._approval import Decision, Pause, PauseError, check_decision, new_pause_id
from cantrip._core._host import Gatekeeper, TurnHost
from cantrip._core._recording import checkpoint
from cantrip._core._state import EntityState
from cantrip._events import PauseEvent
from cantrip._gate import Gate, GateArgumentError
from cantrip._redact import get_logger
from cantrip.llm._contract import Response
from cantrip.loom._model import GateCallRecord
from cantrip.medium import Execution

PauseHandler = Callable[[Pause], Awaitable[Decision]]
"""A front end's way to ask its human: shows the pause, returns the decision."""

PauseMode = Literal["return", "wait", "leave"]

log = get_logger("cantrip.entity")


@attrs.define(eq=False)
class Waiter:
    pause: Pause
    event: trio.Event = attrs.field(factory=trio.Event)
    decision: Decision | None = None


@attrs.define(eq=False)
class PauseBoard:
    """The pauses of one entity tree that a live task waits on, and who answers them.

    Shared by a root entity and every child it spawns, so an answer given to the
    root (an API call, an HTTP request, an ACP permission reply) reaches a child
    that waits inside a batch."""

    waiting: dict[str, Waiter] = attrs.field(factory=dict)
    always: set[str] = attrs.field(factory=set)
    """Gates the human approved "always" (for this tree, in this process)."""
    handler: PauseHandler | None = None


class PauseExit(Exception):
    """Leaves a cast at a pause (``pause="return"``): the loom holds the pause."""

    def __init__(self, pause: Pause) -> None:
        super().__init__(pause.pause_id)
        self.pause = pause


class Pauses:
    """One entity's pauses: the board of its tree, and how it meets a pause.

    It keeps no reference to its entity -- the entity passes itself to each
    method -- so holding it makes no reference cycle."""

    __slots__ = ("board", "mode")

    def __init__(self, board: PauseBoard, mode: PauseMode) -> None:
        self.board = board
        self.mode: PauseMode = mode
        """``"return"``: a cast that meets a pause returns ``paused`` (answer it to go
        on); ``"wait"``: it waits in place for :meth:`Entity.answer` or the ``on_pause``
        handler; ``"leave"`` (workers): returns ``paused`` even from inside running
        code, whose process is then let go as if it had died -- the answer continues
        from the loom (the rest of that code block does not run). Children always
        wait in place."""

    # -- what waits, and answers --------------------------------------------------

    def live(self) -> tuple[Pause, ...]:
        """The pauses a live task of this entity tree waits on in place."""
        return tuple(w.pause for w in self.board.waiting.values() if w.decision is None)

    def pending(self, entity: EntityState) -> tuple[Pause, ...]:
        """The live pauses, else the one the loom holds at the entity's leaf."""
        live = self.live()
        if live or entity._cast is not None:
            return live
        stored = self.stored(entity)
        return (stored,) if stored is not None else ()

    def stored(self, entity: EntityState) -> Pause | None:
        """The pause the loom holds at the entity's leaf, if it is one."""
        if entity._leaf is None:
            return None
        last = entity.loom.get(entity._leaf)
        marker = last.extras.get("pending")
        if last.entity_id != entity.id or not isinstance(marker, Mapping):
            return None
        return Pause.from_dict(marker, checkpoint_id=last.id)

    def answer_with(self, handler: PauseHandler) -> None:
        """Let ``handler`` answer the pauses in place."""
        self.board.handler = handler
        self.mode = "wait"

    def answer_live(self, pause_id: str, decision: Decision) -> bool:
        """Hand ``decision`` to the live task waiting on ``pause_id``; whether one waits."""
        waiter = self.board.waiting.get(pause_id)
        if waiter is None:
            return False
        check_decision(waiter.pause, decision)
        if waiter.decision is not None:
            raise PauseError(f"pause {pause_id} was already answered")
        waiter.decision = decision
        waiter.event.set()
        return True

    def answerable(self, entity: EntityState, pause_id: str, decision: Decision) -> Pause:
        """The pause only the loom holds that ``decision`` answers, or :class:`PauseError`."""
        stored = self.stored(entity) if entity._cast is None else None
        if stored is None or stored.pause_id != pause_id:
            raise PauseError(
                f"entity {entity.id} has no pending pause {pause_id!r} (already answered?)"
            )
        check_decision(stored, decision)
        return stored

    def recorded_answer(self, entity: EntityState) -> tuple[Pause, Decision] | None:
        """The answer at the entity's leaf that was recorded but never carried out
        (see :meth:`Entity.recorded_answer`), with the pause it answered."""
        if entity._leaf is None or entity._cast is not None:
            return None
        loom = entity.loom
        last = loom.get(entity._leaf)
        mark = last.extras.get("answered")
        if last.entity_id != entity.id or not isinstance(mark, Mapping) or last.parent_id is None:
            return None
        paused = loom.get(last.parent_id)
        marker = paused.extras.get("pending")
        if not isinstance(marker, Mapping) or marker.get("pause_id") != mark.get("pause_id"):
            return None
        decision = Decision.parse({k: v for k, v in mark.items() if k != "pause_id"})
        return Pause.from_dict(marker, checkpoint_id=paused.id), decision

    # -- meeting a pause ----------------------------------------------------------

    def gatekeeper(self, entity: EntityState) -> Gatekeeper:
        """The turn host's gatekeeper for ``entity``: :meth:`gate_call`."""
        return functools.partial(self.gate_call, entity)

    async def gate_call(
        self, entity: EntityState, name: str, args: Mapping[str, Any], tool_call_id: str | None
    ) -> GateCallRecord:
        """A gate call in a circle where calls may need a human (the pause)."""
        circle = entity.circle
        g = circle.gate(name)
        verdict = circle.verdict(name, args)
        if g is None or verdict == "allow":
            return await _run_gate(entity, name, args, tool_call_id)
        if verdict == "deny":
            message = f"denied by the approval policy: {g.name} may not be called with these"
            return circle.unexecuted(g.name, args, tool_call_id, "error", message)
        if not g.asks_user and g.name in self.board.always:
            return await _run_gate(entity, name, args, tool_call_id)
        try:
            g.validate(args)  # a human is never asked about a call that cannot run
        except GateArgumentError as exc:
            return circle.unexecuted(g.name, args, tool_call_id, "error", str(exc))
        pause = self._open_pause(entity, g, args, tool_call_id)
        decision = await self._await_decision(entity, pause)
        return await self.apply_decision(entity, pause, decision)

    async def ask_during_call(
        self,
        entity: EntityState,
        gate: str,
        question: str,
        *,
        origin: str,
        schema: Mapping[str, Any] | None = None,
        url: str | None = None,
    ) -> Decision:
        """A question asked from inside a running call (see :meth:`Entity.ask_during_call`)."""
        if not entity.questions_in_calls:
            return Decision.deny("no one can be asked during a call here")
        pause = Pause(
            pause_id=new_pause_id(),
            entity_id=entity.id,
            kind="question",
            gate=gate,
            question=question,
            origin=origin,
            schema=schema,
            url=url,
        )
        inflight = entity._inflight
        recording = (
            entity._cast is not None
            and inflight is not None
            and inflight.response is not None
            and inflight.host is not None
        )
        pause = self._post_pause(entity, pause, in_loom=recording)
        decision = await self._await_decision(entity, pause)
        if recording:
            answered = {"pause_id": pause.pause_id, **decision.to_dict()}
            checkpoint(entity, marks={"answered": answered})
            await entity.loom.sync(entity.id)
        return decision

    def _open_pause(
        self, entity: EntityState, g: Gate, args: Mapping[str, Any], tool_call_id: str | None
    ) -> Pause:
        question = args.get("question") if g.asks_user else None
        pause = Pause(
            pause_id=new_pause_id(),
            entity_id=entity.id,
            kind="question" if g.asks_user else "approval",
            gate=g.name,
            args=args,
            tool_call_id=tool_call_id,
            question=None if question is None else str(question),
        )
        return self._post_pause(entity, pause)

    def _post_pause(self, entity: EntityState, pause: Pause, *, in_loom: bool = True) -> Pause:
        """Record ``pause`` as pending in the loom, list it, and tell the event sink."""
        if in_loom:
            checkpoint_id = checkpoint(entity, marks={"pending": pause.to_dict()})
            pause = attrs.evolve(pause, checkpoint_id=checkpoint_id)
        self.board.waiting[pause.pause_id] = Waiter(pause)
        log.info("%s paused: %s %s waits for a human", entity.id, pause.kind, pause.gate)
        if entity.on_event is not None:
            entity._emit(PauseEvent(pause=pause))
        return pause

    async def _await_decision(self, entity: EntityState, pause: Pause) -> Decision:
        board = self.board
        waiter = board.waiting[pause.pause_id]
        try:
            if board.handler is None and (
                (self.mode == "return" and _returnable(entity, pause)) or self.mode == "leave"
            ):
                raise PauseExit(pause)
            policy = entity.circle.approval
            timeout = policy.timeout_s if policy is not None and pause.kind == "approval" else None
            with trio.move_on_after(math.inf if timeout is None else timeout):
                async with trio.open_nursery() as nursery:
                    if board.handler is not None:
                        nursery.start_soon(_ask_human, board.handler, waiter)
                    await waiter.event.wait()
                    nursery.cancel_scope.cancel()
            if waiter.decision is None:
                waiter.decision = Decision.deny("timed out")
            return waiter.decision
        finally:
            board.waiting.pop(pause.pause_id, None)

    # -- carrying out an answer -----------------------------------------------------

    async def apply_decision(
        self, entity: EntityState, pause: Pause, decision: Decision, *, recorded: bool = False
    ) -> GateCallRecord:
        """Record the answer, then carry it out: the gate runs at most once per answer.

        The answer is durable before the effect (on a deferred store -- PostgreSQL --
        the loom is synced), so a worker that dies after this point leaves a loom
        that says the answer was given: the next worker carries it out through the
        journal (:meth:`Entity.carry_out_recorded_answer`) instead of taking it again."""
        if not recorded:
            answered = {"pause_id": pause.pause_id, **decision.to_dict()}
            checkpoint(entity, marks={"answered": answered})
            await entity.loom.sync(entity.id)
        if decision.always:
            self.board.always.add(pause.gate)
        circle = entity.circle
        approval: dict[str, Any] = {"pause_id": pause.pause_id, "decision": decision.kind}
        if decision.reason:
            approval["reason"] = decision.reason
        if pause.origin is not None:
            # Only a process that stopped while the call asked gets here (answered from
            # the loom): the call that asked is gone, so the answer reaches nobody.
            message = (
                f"the call was cut off while {pause.origin} waited for the user's answer "
                "(the process stopped); the answer was not delivered"
            )
            record = circle.unexecuted(pause.gate, pause.args, pause.tool_call_id, "error", message)
        elif decision.kind == "deny":
            who = (
                "the user declined to answer" if pause.kind == "question" else "denied by the user"
            )
            message = f"{who}: {decision.reason or 'no reason given'}"
            record = circle.unexecuted(pause.gate, pause.args, pause.tool_call_id, "error", message)
        elif pause.kind == "question":
            record = GateCallRecord(
                gate=pause.gate,
                args=pause.args,
                result=decision.text,
                tool_call_id=pause.tool_call_id,
            )
        elif decision.kind == "edit" and decision.args is not None:
            approval["original_args"] = dict(pause.args)
            return await self._apply_edit(entity, pause, decision.args, approval)
        else:
            record = await _run_gate(entity, pause.gate, pause.args, pause.tool_call_id)
        return attrs.evolve(record, detail={**record.detail, "approval": approval})

    async def _apply_edit(
        self,
        entity: EntityState,
        pause: Pause,
        args: Mapping[str, Any],
        approval: Mapping[str, Any],
    ) -> GateCallRecord:
        """Run the human's edited arguments -- as a new call: they are validated and
        judged by the approval policy like the model's own (issue 28, item 7). Denied:
        an error observation with the reason; "ask": a new pause for these arguments
        (answered like any other, here or by any later process); allowed: the gate runs.
        Every answer, in place or from the loom, in any process, comes through here."""
        circle = entity.circle
        g = circle.gate(pause.gate)
        message: str | None = None
        if g is not None:
            policy = circle.approval
            try:
                g.validate(args)  # the policy only ever judges arguments that can run
                verdict = policy.verdict(g.name, args) if policy is not None else "allow"
            except GateArgumentError as exc:
                message = f"the edited arguments were refused: {exc}"
            else:
                if verdict == "deny":
                    message = (
                        f"denied by the approval policy: {g.name} may not be called with the "
                        "edited arguments"
                    )
                elif verdict == "ask":
                    again = self._open_pause(entity, g, args, pause.tool_call_id)
                    decision = await self._await_decision(entity, again)
                    return await self.apply_decision(entity, again, decision)
        if message is not None:
            record = circle.unexecuted(pause.gate, args, pause.tool_call_id, "error", message)
        else:
            record = await _run_gate(entity, pause.gate, args, pause.tool_call_id)
        return attrs.evolve(record, detail={**record.detail, "approval": dict(approval)})


def _returnable(entity: EntityState, pause: Pause) -> bool:
    """A cast can leave at a pause only between tool calls, not inside running code."""
    inflight = entity._inflight
    calls = inflight.response.tool_calls if inflight and inflight.response else ()
    return pause.origin is None and any(
        c.id == pause.tool_call_id and c.name == pause.gate for c in calls
    )


async def _ask_human(handler: PauseHandler, waiter: Waiter) -> None:
    decision = await handler(waiter.pause)
    if waiter.decision is None:  # an answer from elsewhere may have come first
        check_decision(waiter.pause, decision)
        waiter.decision = decision
        waiter.event.set()


async def _run_gate(
    entity: EntityState, name: str, args: Mapping[str, Any], tool_call_id: str | None
) -> GateCallRecord:
    """Run a gate the human (or the policy) let through, journaled like any call."""
    host = entity._inflight.host if entity._inflight is not None else None
    if host is not None:
        return await host.run(name, args, tool_call_id)
    return await entity.circle.call(name, args, tool_call_id)


async def rest_of_utterance(
    entity: EntityState,
    pause: Pause,
    record: GateCallRecord,
    response: Response,
    host: TurnHost,
    done_before: int,
) -> Execution:
    """What the rest of a paused utterance does once ``record`` (the answered call)
    is known: its remaining tool calls run now; code that paused cannot go on."""
    calls = response.tool_calls
    index = next(
        (i for i, c in enumerate(calls) if c.id == pause.tool_call_id and c.name == pause.gate),
        None,
    )
    if index is not None:  # a tool call of its own: the rest of the calls run now
        records = [record]
        terminated = record.status == "ok" and entity.circle.terminates(pause.gate)
        result = record.result if terminated else None
        remaining = calls[index + 1 :]
        if remaining and not terminated:
            assert entity._session is not None
            rest = await entity._session.execute(attrs.evolve(response, tool_calls=remaining), host)
            records.extend(rest.gate_calls)
            terminated, result = rest.terminated, rest.result
        elif remaining:
            records.extend(
                host.unexecuted(c.name, c.arguments, c.id, "skipped", "skipped: done was called")
                for c in remaining
            )
        observation = "\n".join(r.text for r in records if r.executed)
        return Execution(
            gate_calls=tuple(records),
            terminated=terminated,
            result=result,
            observation=observation,
        )
    # Inside code: the process that ran it is gone, so the code cannot go on from
    # the call. The model learns what the human decided and what it did.
    message = (
        f"Your code stopped at {pause.gate}() to wait for a human; it was answered after "
        f"the sandbox had been released, so the rest of that code block did not run. "
        f"The call's outcome: {record.text}"
    )
    skipped = [
        host.unexecuted(c.name, c.arguments, c.id, "skipped", "skipped: the block ended")
        for c in calls[1:]
    ]
    texts = [message, *(r.text for r in skipped)]
    return Execution(
        gate_calls=(record, *skipped),
        terminated=record.status == "ok" and entity.circle.terminates(pause.gate),
        result=record.result,
        observation="\n\n".join(texts),
        extras={
            "observations": texts,
            "host_calls": [done_before + 1, *([1] * len(skipped))],
            "sandbox_resets": [0],
        },
    )
