"""The loop ward at run time (``max_repeats``, issue 43): is the entity repeating itself?

A cast ends with reason ``loop`` when, with ``max_repeats = N``,

* the same gate was called with the same arguments N times in a row -- the calls of
  the cast in the order they were made, across turns and inside one utterance; or
* N turns in a row added nothing new to the thread: the same utterance and the same
  observation as the turn before.

Arguments are compared by value (their canonical JSON: key order does not matter,
``true`` is not ``1``). The results do not matter to the first rule -- a model
polling a gate with the same arguments is repeating itself -- while the second
needs the observations to repeat too, so turns whose calls vary as a group but
whose answers change are progress. Only the cast's own turns count (a cast
continued after a pause starts counting again): the check reads backwards from
the newest turn and stops at the first difference, so it costs at most N turns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from cantrip.loom._model import GateCallRecord, Turn


def repeat_note(
    limit: int,
    turns: Sequence[Turn],
    calls: Sequence[GateCallRecord],
    said: str | None,
    observation: str,
) -> str | None:
    """Why the turn being recorded ends the cast as a loop (``None``: it does not).

    ``turns`` are the cast's recorded turns; ``calls``, ``said`` (its utterance;
    ``None`` for the continuation of a split turn, which is not compared) and
    ``observation`` are the new turn's."""
    if calls:
        last = calls[-1]
        canonical: str | None = None  # the last call's arguments as JSON, once needed
        for count, record in enumerate(_calls_backwards(turns, calls), start=1):
            # the cheap comparisons first: most turns differ from the one before
            if record.gate != last.gate or record.args != last.args:
                break
            if record is not last:
                canonical = canonical or last.arguments
                if record.arguments != canonical:  # equal as dicts, not as JSON: true vs 1
                    break
            if count >= limit:
                return f"{last.gate} was called {limit} times in a row with the same arguments"
    if said is None:
        return None
    count = 1
    for turn in reversed(turns):
        if turn.extras.get("phase") or turn.utterance != said or turn.observation != observation:
            break
        count += 1
        if count >= limit:
            return f"{limit} turns in a row added nothing new to the thread"
    return None


def _calls_backwards(
    turns: Sequence[Turn], calls: Sequence[GateCallRecord]
) -> Iterator[GateCallRecord]:
    yield from reversed(calls)
    for turn in reversed(turns):
        yield from reversed(turn.gate_calls)
