"""The gate-call journal: effects happen once, even when a worker dies mid-turn.

A turn reaches the loom only when it is complete, so a crash in the middle of
one loses the utterance and the gate calls it made. The journal keeps them,
keyed by (entity, turn sequence, call ordinal), in the loom's own database
(SQLite or PostgreSQL; SPEC.md "Ownership, fencing and effects on PostgreSQL"):

* the utterance (ordinal -1), committed with the first gate call it makes, before that
  gate runs, as one row: the utterance's row carries that call's start (its ordinal; its
  gate, id and data only when they are not the utterance's call's at that ordinal with
  the very same arguments -- a reader rebuilds them from the utterance; issue 46.2). On
  resume the turn continues with the *same* utterance instead of asking the LLM again (a turn
  that calls no journaled gate journals nothing: nothing of it took effect, so a crash
  before it is recorded asks the LLM again);
* each later gate call as *started* before the gate runs (that commit is waited for), and
  its result as soon as it returns -- committed, in order, with the turn's next write:
  the next call's start, or the turn itself. A result committed with its turn is not
  journaled at all (the turn row holds it: each piece is written once; on PostgreSQL
  ``cantrip.loom._postgres_writes`` drops it from the batch). Before anything that may
  wait (a human's approval, a ``result`` guardrail) the turn's journal is flushed
  (:meth:`TurnJournal.flush`), so a result is never held back across a long wait.

On resume, for each call of the journaled utterance:

* a recorded result is reused -- the gate does not run again;
* a call that was started but never finished is run again only if the gate is
  ``idempotent=True``, or given back the checkpoint it saved
  (:mod:`cantrip._checkpoint`: an MCP task's id, followed to its end instead of
  called again); otherwise the entity gets an ``is_error`` observation
  "outcome unknown after a worker crash" (and that answer is journaled, so a
  second crash gives the same one) -- never a silent second side effect;
* a call never started runs normally.

The ``done`` gate and unknown gate names have no effects and are not journaled.
Guarantees (SPEC.md): a turn is attempted at least once and recorded at most
once; a gate call whose result was journaled takes effect exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from cantrip._checkpoint import CURRENT as CURRENT_CHECKPOINT
from cantrip._checkpoint import MAX_CHECKPOINT, CallCheckpoint
from cantrip._record_cap import cap_record, record_cap
from cantrip.llm._contract import Response, ToolCall, Usage, plain_json, plain_leaf
from cantrip.loom._codec import decode_record, encode_record, holds_secret
from cantrip.loom._indexed import JournalEntry
from cantrip.loom._model import GateCallRecord

if TYPE_CHECKING:
    from cantrip._circle import Circle
    from cantrip.loom._loom import Loom

UTTERANCE = -1
"""The journal ordinal of a turn's utterance (gate calls count from 0)."""

OUTCOME_UNKNOWN = (
    "outcome unknown after a worker crash: this call was started but its result was "
    "never recorded, and the gate is not idempotent, so it was not run again"
)


CHECKPOINTS = 1 << 30
"""Call ``k``'s checkpoint is journaled at ordinal ``CHECKPOINTS + k``: a row of its
own, so a result is still written once over the started call's row, and a fresh
utterance voids checkpoints with the calls (every ordinal >= 0). The column is a
32-bit integer; no turn makes 2**30 calls."""


def _dumps(value: Any) -> str:
    """Journal data, encoded as the loom's records are: exactly, whatever the
    value boundary let through (big integers, lone surrogates; cantrip._values).

    ``encode_record(plain_json(value))``, and the same text: orjson walks the value
    once, turning what it does not know by :func:`plain_leaf` (read-only mappings,
    models), instead of a copy made as plain data first (issue 46: ~50 us a turn).
    What orjson refuses (a big integer, a non-text key), or a text that quotes a
    secret, takes the general route."""
    try:
        text = orjson.dumps(value, default=plain_leaf).decode()
    except TypeError:
        return encode_record(plain_json(value))
    return encode_record(plain_json(value)) if holds_secret(text) else text


def encode_response(response: Response) -> str:
    """An LLM response as journal data (everything a turn is made from), each field
    only when it holds something: a field left out reads back as its default
    (:func:`decode_response`), and the journal is written on every turn that calls a
    gate (issue 46.2: a null or zero field cost WAL for nothing)."""
    calls = []
    for c in response.tool_calls:
        call: dict[str, Any] = {"id": c.id, "name": c.name, "arguments": c.arguments}
        if c.raw_arguments is not None:
            call["raw_arguments"] = c.raw_arguments
        calls.append(call)
    usage = {k: v for k, v in response.usage.to_dict().items() if v and k != "total_tokens"}
    if response.usage.missing:
        usage["missing"] = True
    data: dict[str, Any] = {"tool_calls": calls}
    optional = {
        "content": response.content,
        "usage": usage,
        "thinking": response.thinking,
        "stop_reason": response.stop_reason,
        "model": response.model,
        "provider": response.provider,
        "metadata": response.metadata,
    }
    data.update((k, v) for k, v in optional.items() if v is not None and v != {})
    return _dumps(data)


def decode_response(data: str) -> Response:
    """A response :func:`encode_response` wrote (or an older writer, that wrote every
    field)."""
    obj = decode_record(data)
    return Response(
        content=obj.get("content"),
        tool_calls=tuple(
            ToolCall(c["id"], c["name"], c.get("arguments") or {}, c.get("raw_arguments"))
            for c in obj["tool_calls"]
        ),
        usage=Usage(**(obj.get("usage") or {})),
        thinking=obj.get("thinking"),
        stop_reason=obj.get("stop_reason"),
        model=obj.get("model"),
        provider=obj.get("provider"),
        metadata=obj.get("metadata") or {},
    )


FIRST_START = "start"
"""The key, in the utterance row's record, of the ordinal of the call it started."""


def _first_start(
    ordinal: int,
    gate: str,
    data: str,
    args: Mapping[str, Any],
    tool_call_id: str | None,
    calls: tuple[ToolCall, ...],
) -> str:
    """The utterance row's record: the first journaled call's start, its ordinal and
    what a reader cannot rebuild from the utterance (:func:`_with_first_start`). When
    the call is the utterance's call of that id with arguments that encode to the very
    same ``data``, the record holds neither the data nor -- if the call is the one at
    ``ordinal`` -- its id, nor -- if the gate has the call's name -- the gate: most
    records are ``{"start": 0}`` (issue 46.2: the id, the gate and the arguments were
    each in the row twice). Compared as encoded text, which is what the journal's
    replay compares (``True`` and ``1`` are equal as values, not as data)."""
    start: dict[str, Any] = {FIRST_START: ordinal}
    at = calls[ordinal] if ordinal < len(calls) else None
    call = at if at is not None and at.id == tool_call_id else None
    if call is None:
        call = next((c for c in calls if c.id == tool_call_id), None)
        if call is not None:
            start["call"] = call.id
    same = call is not None and (
        call.arguments is args
        or (
            call.arguments == args
            and _dumps({"args": call.arguments, "tool_call_id": call.id}) == data
        )
    )
    if not same:
        return _dumps({FIRST_START: ordinal, "gate": gate, "data": data})
    assert call is not None
    if gate != call.name:
        start["gate"] = gate
    return _dumps(start)


def _with_first_start(entries: list[JournalEntry]) -> dict[int, JournalEntry]:
    """The journal's entries by ordinal, the first call's start (kept in the utterance's
    row: :func:`_first_start`) among them as the row of its own it stands for. A row
    the call has of its own (its result, written later) is the one that counts."""
    by_ordinal = {e[0]: e for e in entries}
    utterance = by_ordinal.get(UTTERANCE)
    if utterance is None or utterance[3] is None:
        return by_ordinal
    start = decode_record(utterance[3])
    ordinal = int(start[FIRST_START])
    if ordinal in by_ordinal:
        return by_ordinal
    data, gate = start.get("data"), start.get("gate")
    if data is None:  # the utterance's call (of that id, or at that ordinal), its arguments
        calls = decode_response(utterance[2]).tool_calls
        named = start.get("call")
        call = calls[ordinal] if named is None else next(c for c in calls if c.id == named)
        data = _dumps({"args": call.arguments, "tool_call_id": call.id})
        gate = call.name if gate is None else gate
    by_ordinal[ordinal] = (ordinal, str(gate), str(data), None)
    by_ordinal[UTTERANCE] = (UTTERANCE, utterance[1], utterance[2], None)
    return by_ordinal


class TurnJournal:
    """The journal of one turn in flight; the gate calls of the turn go through it."""

    __slots__ = (
        "entity_id",
        "entries",
        "loom",
        "ordinal",
        "pending",
        "sequence",
        "unsynced",
    )

    def __init__(
        self, loom: Loom, entity_id: str, sequence: int, entries: list[JournalEntry]
    ) -> None:
        self.loom = loom
        self.entity_id = entity_id
        self.sequence = sequence
        self.entries: Mapping[int, JournalEntry] = _with_first_start(entries)
        self.ordinal = 0
        self.pending: Response | None = None
        """A fresh utterance not yet journaled: it goes with the first call's start, in
        one row (encoded then: a turn that calls no journaled gate never encodes it)."""
        self.unsynced = False
        """A result was queued and its commit not yet waited for."""

    @property
    def utterance(self) -> Response | None:
        """The utterance a crashed attempt of this turn already received, if any."""
        entry = self.entries.get(UTTERANCE)
        return decode_response(entry[2]) if entry is not None else None

    async def record_utterance(self, response: Response) -> None:
        """Keep the utterance to journal with the first gate call it makes (nothing is
        written for a turn that makes none)."""
        self.pending = response

    async def flush(self) -> None:
        """Wait for the commit of the results queued so far (before a wait that may be
        long: a result is then never held back in memory across it)."""
        if self.unsynced:
            self.unsynced = False
            await self.loom.sync(self.entity_id)

    async def call(
        self, circle: Circle, name: str, args: Mapping[str, Any], tool_call_id: str | None
    ) -> GateCallRecord:
        """One gate call through the journal (see the module docstring)."""
        ordinal = self.ordinal
        self.ordinal += 1
        g = circle.gate(name)
        if g is None or g.terminates:
            return await circle.call(name, args, tool_call_id)
        data = _dumps({"args": args, "tool_call_id": tool_call_id})
        entry = self.entries.get(ordinal)
        saved: Mapping[str, Any] | None = None
        if entry is not None and entry[1] == g.name and entry[2] == data:
            if entry[3] is not None:  # recorded before the crash: reuse, never re-run
                return GateCallRecord.from_dict(decode_record(entry[3]))
            kept = self.entries.get(CHECKPOINTS + ordinal)
            if kept is not None and kept[1] == g.name and kept[2] == data and kept[3]:
                saved = decode_record(kept[3])  # started work the gate can follow to its end
            if saved is None and not g.idempotent:
                record = GateCallRecord(
                    gate=g.name,
                    args=args,
                    result=OUTCOME_UNKNOWN,
                    is_error=True,
                    tool_call_id=tool_call_id,
                    status="error",
                    detail={"outcome_unknown": True},
                )
                await self._finish(ordinal, g.name, data, record)
                return record
        if self.pending is not None:  # the utterance, one row with its first call's start
            utterance, self.pending = self.pending, None
            start = _first_start(ordinal, g.name, data, args, tool_call_id, utterance.tool_calls)
            await self.loom.journal_write(
                self.entity_id,
                self.sequence,
                UTTERANCE,
                "",
                encode_response(utterance),
                start,
            )
        else:
            await self.loom.journal_write(
                self.entity_id, self.sequence, ordinal, g.name, data, None
            )
        self.unsynced = False  # (that commit carried every result queued before it)

        async def save(checkpoint: Mapping[str, Any]) -> None:
            encoded = _dumps(checkpoint)
            if len(encoded) > MAX_CHECKPOINT:
                raise ValueError(
                    f"a gate checkpoint takes at most {MAX_CHECKPOINT} characters "
                    f"({len(encoded)} given): save a handle on the work, not its data"
                )
            await self.loom.journal_write(
                self.entity_id, self.sequence, CHECKPOINTS + ordinal, g.name, data, encoded
            )

        token = CURRENT_CHECKPOINT.set(CallCheckpoint(saved, save))
        try:
            record = await circle.call(name, args, tool_call_id)
        finally:
            CURRENT_CHECKPOINT.reset(token)
        stored = cap_record(record, record_cap(circle.resolved))
        await self._finish(ordinal, g.name, data, stored)
        return record  # the medium works with the whole result; the journal keeps the cap

    async def _finish(self, ordinal: int, gate: str, data: str, record: GateCallRecord) -> None:
        """Queue the call's result: committed with the turn's next write (module docstring).

        Encoded only if it is written (by the store, when it writes it): a result that
        commits with its turn is dropped unwritten, most of them (issue 46.4)."""
        await self.loom.journal_write(
            self.entity_id,
            self.sequence,
            ordinal,
            gate,
            data,
            lambda: _dumps(record.to_dict()),
            durable=False,
        )
        self.unsynced = True
