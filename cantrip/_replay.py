"""Rebuilding a sandbox by replay: forks and resumed entities in code mediums.

Spec 6.6 lets an implementation capture sandbox state at a fork point by
*snapshot* or by *replay*; cantrip replays. The new entity's sandbox runs the
recorded code of its thread again, from the root to the fork point (or, for a
resumed entity, to its last committed turn), and every host call the code
makes is answered from the loom's :class:`~cantrip.GateCallRecord` -- the gate
itself is never called (LOOM-13), so counters do not count again, messages are
not sent twice and children are not spawned again.

How it lines up. A code medium records, per turn, the host calls of each code
call in order (and, in ``extras["host_calls"]``, how many belong to each code
call). Replaying deterministic code makes the same calls in the same order, so
each one takes the next recorded completion: the result, or the error the code
then saw as an exception. A call that does not match the record (the code read
a clock or random numbers and went another way) is answered with an error and
counted as a *divergence*; the gate is still not called. Turns whose sandbox
was lost (``extras["sandbox_resets"]``: time limit, killed worker) reset the
sandbox instead of running the code again; a turn cut off from outside
(timeout, cancellation, crash) is replayed up to the cut and then handled as
the medium handled it live -- JavaScript lost its worker, Python finished the
suspended feed without calling anything.

Which turns. The entity's lineage (:meth:`~cantrip.Loom.lineage`), delegation
pieces merged, restricted to turns of entities in the same medium. A medium
whose sessions have no ``replay_call`` keeps no state worth replaying
(conversation) or cannot replay it (bash: shell side effects are not
idempotent); the loom records its fork strategy accordingly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from cantrip._circle import Circle
from cantrip._gate import Gate
from cantrip._redact import get_logger
from cantrip.llm._contract import ToolCall
from cantrip.loom._loom import Loom
from cantrip.loom._model import CallStatus, GateCallRecord, Turn
from cantrip.loom._view import history_view, logical_turns
from cantrip.medium import GateHost, Medium, MediumSession

log = get_logger("cantrip.replay")

CUT_REASONS = frozenset({"timeout", "cancelled", "parent_terminated", "crashed"})
"""Reasons of a turn recorded while its code may still have been running."""


class ReplayCut(Exception):
    """Replay reached the point where the recorded code call was cut off."""


@runtime_checkable
class ReplayableSession(MediumSession, Protocol):
    """A medium session that can rebuild its state by running recorded code again."""

    replay_cut_resets: bool
    """Whether a code call cut off from outside lost the sandbox (so replay resets it)."""

    async def replay_call(self, call: ToolCall, host: GateHost) -> bool: ...

    async def replay_reset(self) -> None: ...


def fork_strategy(medium: Medium) -> str:
    """What the loom records as a fork's strategy for sandbox state (spec 6.6).

    ``replay`` for the conversation medium (its only state is the context,
    rebuilt from the thread) and for mediums that declare it; a medium without
    a declaration is recorded as ``context-only``: its context is replayed but
    its sandbox starts fresh.
    """
    declared = getattr(medium, "fork_strategy", None)
    if isinstance(declared, str):
        return declared
    return "replay" if medium.name == "conversation" else "context-only"


@attrs.define
class ReplayReport:
    """What a replay did: how much it ran and whether the code went its own way."""

    turns: int = 0
    code_calls: int = 0
    hydrated: int = 0
    """Host calls answered from recorded results (no gate ran)."""
    resets: int = 0
    divergences: list[str] = attrs.field(factory=list)
    duration_ms: float = 0.0


class ReplayHost:
    """A :class:`~mediums.base.GateHost` that answers from the record, never from the gates."""

    def __init__(
        self,
        circle: Circle,
        records: Sequence[GateCallRecord],
        report: ReplayReport,
        *,
        cut: bool = False,
        history: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.circle = circle
        self._records = list(records)
        self._next = 0
        self._report = report
        self._cut = cut
        self._history = history

    @property
    def consumed(self) -> int:
        return self._next

    @property
    def gates(self) -> Sequence[Gate]:
        return self.circle.gates

    def gate(self, name: str) -> Gate | None:
        return self.circle.gate(name)

    def terminates(self, name: str) -> bool:
        return self.circle.terminates(name)

    def history(self) -> list[dict[str, Any]]:
        """The ``loom`` object's contents as they were when this code first ran."""
        return self._history() if self._history is not None else []

    def _take(self, name: str) -> GateCallRecord | None:
        if self._next >= len(self._records):
            return None
        record = self._records[self._next]
        found = self.circle.gate(name)
        canonical = found.name if found is not None else name
        if record.gate not in (name, canonical):
            return None
        if self._cut and record.status == "cancelled":
            return None  # the live call never returned: this is where the code was cut
        self._next += 1
        return record

    async def call(
        self, name: str, args: Mapping[str, Any], tool_call_id: str | None = None
    ) -> GateCallRecord:
        record = self._take(name)
        if record is not None:
            self._report.hydrated += 1
            cut = record.detail.get("result_cut")
            if isinstance(cut, Mapping):
                self._report.divergences.append(
                    f"replay: the loom keeps {cut.get('kept')} of the {cut.get('chars')} "
                    f"characters {record.gate} returned (max_record_chars); the code sees "
                    "that part, as text"
                )
            return record
        if self._cut:
            raise ReplayCut(name)
        expected = self._records[self._next].gate if self._next < len(self._records) else "nothing"
        message = f"replay: the loom records {expected} here, not {name}; the gate was not called"
        self._report.divergences.append(message)
        return self.circle.unexecuted(name, args, tool_call_id, "error", message)

    def unexecuted(
        self,
        name: str,
        args: Mapping[str, Any],
        tool_call_id: str | None,
        status: CallStatus,
        message: str,
    ) -> GateCallRecord:
        self._take(name)  # stays aligned with the record, which holds this completion too
        return self.circle.unexecuted(name, args, tool_call_id, status, message)


async def restore_session(
    session: MediumSession,
    circle: Circle,
    loom: Loom,
    history: Sequence[Turn],
) -> ReplayReport | None:
    """Replay ``history`` (an entity's lineage) into a fresh ``session``.

    Returns None when the session has nothing to replay (it is not a
    :class:`ReplayableSession`, or no turn of ``history`` ran in this medium).
    """
    if not isinstance(session, ReplayableSession):
        return None
    medium = circle.medium.name
    turns = logical_turns(history)
    report = ReplayReport()
    started = time.perf_counter()
    for index, turn in enumerate(turns):
        if not turn.tool_calls or loom.entity(turn.entity_id).medium != medium:
            continue
        report.turns += 1

        def seen(upto: int = index) -> list[dict[str, Any]]:
            return history_view(turns[:upto], loom.reward)

        await _replay_turn(session, circle, turn, report, seen)
    report.duration_ms = (time.perf_counter() - started) * 1000.0
    if report.divergences:
        log.warning(
            "replay diverged from the loom %d time(s); first: %s",
            len(report.divergences),
            report.divergences[0],
        )
    return report


async def _replay_turn(
    session: ReplayableSession,
    circle: Circle,
    turn: Turn,
    report: ReplayReport,
    seen: Callable[[], list[dict[str, Any]]],
) -> None:
    cut = turn.truncated and turn.reason in CUT_REASONS
    if cut and (session.replay_cut_resets or turn.extras.get("sandbox_lost") is True):
        report.resets += 1
        await session.replay_reset()
        return
    records = list(turn.gate_calls)
    counts = _int_list(turn.extras.get("host_calls"), len(turn.tool_calls))
    resets = set(_int_list(turn.extras.get("sandbox_resets")) or ())
    offset = 0
    for index, call in enumerate(turn.tool_calls):
        size = counts[index] if counts is not None else None
        window = records[offset : offset + size] if size is not None else records[offset:]
        if call.cut_off:
            # Never run the first time (its arguments were cut by the token limit).
            offset += size if size is not None else 1
            continue
        if index in resets:
            report.resets += 1
            await session.replay_reset()
            offset += size or 0
            continue
        host = ReplayHost(circle, window, report, cut=cut, history=seen)
        report.code_calls += 1
        try:
            done = await session.replay_call(call, host)
        except ReplayCut:
            return
        offset += size if size is not None else host.consumed
        if done:
            return


def _int_list(value: Any, length: int | None = None) -> list[int] | None:
    if not isinstance(value, list | tuple) or not all(isinstance(v, int) for v in value):
        return None
    if length is not None and len(value) != length:
        return None
    return list(value)
