"""Where an event stands in its session: the id every stream's events carry (issue 44).

An event id is ``<turn>.<index>``: ``turn`` is how many of the session's turns were
recorded when the event was told, ``index`` counts the events told since that turn
was recorded. A recorded turn's own events come first and are read again from the
loom, the same on every replica and after a restart:

* ``n.0`` -- ``step_complete`` of the session's ``n``-th turn;
* ``n.1`` -- ``final_response``, when that turn ended its cast;
* then the calls that turn waits on a human for (a checkpoint's pauses), in the
  order of their ids;
* then, in process only, what happens while turn ``n+1`` is being made and is not
  recorded as such (token deltas, tool calls, usage, tool results, gate progress,
  a question asked in place): ``n.<R+j>``. These are kept in a bounded log per
  session (:data:`RESUMABLE_EVENTS`), not in the loom; the turn they build up to is.

Before a session's first turn, ``0.<j>`` (so ``0.-1``, never told, is "from the
beginning"). Ids order events: compare them as ``(turn, index)`` pairs.

Resuming after an id (``Last-Event-ID``) tells every event after it; a recorded one is
always there (while the loom keeps the session), a live one only while the log holds
it. A client asking to resume after a live id the log no longer holds (it went out of
the log, or the process restarted) is told ``reset`` first -- naming the id it asked
for and the oldest one still held -- and then the session's events from the first
recorded one after it: what it missed of that turn in the making is in the turn.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cantrip._events import FinalResponse, PauseEvent, StepComplete
from cantrip.llm._stream import Event
from cantrip.loom._model import Turn
from cantrip.protocols.sessions._backend import EventId as EventId
from cantrip.protocols.sessions._backend import SessionError, SessionEvent
from cantrip.protocols.sessions._shapes import event_dict, recorded_events

RESUMABLE_EVENTS = 2000
"""Live (unrecorded) events a session keeps in process to resume from; recorded ones
are read again from the loom."""

CUT_PROMPTS = 256
"""Prompts a session's log remembers it let events of go (:attr:`EventLog.cut`)."""

WATCHER_BUFFER = 1000
"""Events a watcher may have waiting to be read; one that falls further behind is
dropped (told ``dropped`` with the last id it was sent) so it never holds up the cast."""

_ID = re.compile(r"(0|[1-9][0-9]{0,11})(?:\.(0|[1-9][0-9]{0,11}))?")


START = EventId(0, -1)
"""Before every event of a session."""


def parse_event_id(raw: str) -> EventId | int:
    """A client's ``Last-Event-ID`` (or ``?after=``): ``n.k`` an event id, ``n`` alone
    a turn count (after the ``n``-th turn and what it records). ``bad_request``
    otherwise -- a hostile header is refused, never parsed further."""
    text = raw.strip()
    found = _ID.fullmatch(text) if len(text) <= 25 else None
    if found is None:
        raise SessionError(
            "bad_request",
            "an event id is <turn>.<index> (two whole numbers, as a stream's `id:` gives "
            "them) or a number of turns",
        )
    turn, index = found.groups()
    return int(turn) if index is None else EventId(int(turn), int(index))


def recorded(turn: Turn, position: int, pauses: int = 0) -> int:
    """How many events turn ``position`` records (``step_complete``, a
    ``final_response`` if it ended its cast, and ``pauses``)."""
    del position
    return 1 + int(turn.terminated) + pauses


def after_turn(turn: Turn | None, position: int) -> EventId:
    """The id of the last event recorded with turn ``position`` (``START`` for 0):
    following after a turn count means after this."""
    if position <= 0 or turn is None:
        return START
    return EventId(position, int(turn.terminated))


def check_reachable(after: int | EventId, turns: int) -> None:
    """``bad_request`` for a place past the session's present (``turns`` recorded):
    a turn not recorded yet, or an event of one."""
    turn = after.turn if isinstance(after, EventId) else after
    if turn < 0 or turn > turns:
        raise SessionError(
            "bad_request",
            f"{'event' if isinstance(after, EventId) else 'turn'} {after} is not one of this "
            f"session's yet: it has {turns} turns",
        )


@attrs.define
class EventLog:
    """A session's told events in process, each with its id; the latest
    :data:`RESUMABLE_EVENTS` are kept (a resume reads recorded ones from the loom).

    What the loom records (a turn, the pause of a checkpoint, a cast's final response)
    is told as :func:`recorded_events` of the turn, exactly as a replica or a resume
    reads it back, so ids agree everywhere; the entity's own announcements of them are
    not told twice. A turn recorded without an announcement (a checkpoint) is told at
    the next turn or pause. ``floor``: events up to it were told before this log began
    (another process, or before the session was last loaded)."""

    last: EventId = START
    floor: EventId = START
    lost: EventId | None = None
    """The newest live event the log let go of (None: none)."""
    events: deque[tuple[SessionEvent, bool]] = attrs.field(
        factory=lambda: deque(maxlen=RESUMABLE_EVENTS)
    )
    """Each held event, and whether the loom records it."""

    told_turn: str | None = None
    """The id of the last turn told (None: none yet): what is new is read after it."""
    cut: dict[str, None] = attrs.field(factory=dict)
    """Prompts some of whose events the log let go of (the latest :data:`CUT_PROMPTS`,
    oldest first): such a prompt can no longer be told again whole from the log."""

    def begin(self, turns: Sequence[Turn]) -> None:
        """Go on from the loom's present: the entity's ``turns``."""
        self.last = self.floor = after_turn(turns[-1] if turns else None, len(turns))
        self.told_turn = turns[-1].id if turns else None

    def record(
        self,
        event: Event,
        entity_id: str,
        since: Callable[[str | None], Sequence[Turn]],
        prompt_id: str | None = None,
    ) -> list[SessionEvent]:
        """What the entity's ``event`` tells followers, stamped. ``since(turn_id)``: the
        entity's turns recorded after that one (all, for None), asked only when one may
        have been recorded -- a range read, so a turn costs what is new, never the
        session's history (tests/test_serve_cost.py)."""
        told: list[SessionEvent] = []
        if isinstance(event, StepComplete | PauseEvent):
            turn = event.turn if isinstance(event, StepComplete) else None
            if (
                turn is not None
                and turn.entity_id == entity_id
                and turn.parent_id == self.told_turn
            ):
                new: Sequence[Turn] = (turn,)  # the one new turn, announced: no read at all
            else:  # a checkpoint recorded unannounced, a pause, a rewind: read what is new
                new = since(self.told_turn)
            first = self.last.turn + 1
            for position, turn in enumerate(new, start=first):
                for said in recorded_events(turn, position):
                    told.append(self._keep(attrs.evolve(said, prompt_id=prompt_id), True))
            if new:
                self.told_turn = new[-1].id
        if _recorded_by_loom(event, entity_id):
            return told
        data = event_dict(event)
        said = SessionEvent(data["type"], data, id=self.last.next(), prompt_id=prompt_id)
        told.append(self._keep(said, False))
        return told

    def _keep(self, event: SessionEvent, recorded: bool) -> SessionEvent:
        assert event.id is not None
        self.last = event.id
        if len(self.events) == self.events.maxlen:
            gone, was_recorded = self.events[0]
            if not was_recorded:
                self.lost = gone.id
            if gone.prompt_id is not None and gone.prompt_id not in self.cut:
                self.cut[gone.prompt_id] = None
                if len(self.cut) > CUT_PROMPTS:
                    del self.cut[next(iter(self.cut))]
        self.events.append((event, recorded))
        return event

    def missing_after(self, after: EventId) -> EventId | None:
        """If live events after ``after`` may be missing from the log, the oldest id
        the log can resume from; None when every event after ``after`` is held or
        recorded."""
        if after < self.floor:  # told before this log began: live ones after it are gone
            return self.floor
        if self.lost is not None and after < self.lost:
            return self.events[0][0].id if self.events else self.last
        return None

    def held(self, after: EventId) -> list[SessionEvent]:
        """The held events after ``after``, in order. The log is in id order, so it is
        read from its end back to ``after`` (a prompt's follower asks on every prompt:
        scanning the whole log with attrs' comparisons cost ~10 ms a prompt), comparing
        plain tuples."""
        key = (after.turn, after.index)
        found: list[SessionEvent] = []
        for event, _ in reversed(self.events):
            said = event.id
            if said is None:
                continue
            if (said.turn, said.index) <= key:
                break
            found.append(event)
        found.reverse()
        return found


def _recorded_by_loom(event: Event, entity_id: str) -> bool:
    """Whether the loom records what ``event`` announces (told from the turn instead):
    the entity's own turn, its final response, the pause of its checkpoint -- not a
    child's (told as it happens)."""
    if isinstance(event, StepComplete):
        return event.turn is not None and event.turn.entity_id == entity_id
    if isinstance(event, FinalResponse):
        return event.entity_id == entity_id
    if isinstance(event, PauseEvent):
        pause = event.pause
        return pause is not None and pause.entity_id == entity_id and bool(pause.checkpoint_id)
    return False


def resolve(after: int | EventId, turns: Sequence[Turn]) -> EventId:
    """Where a follow of the session with ``turns`` starts: a turn count means after
    that turn's recorded events; an id past the session's present is ``bad_request``."""
    check_reachable(after, len(turns))
    if isinstance(after, EventId):
        return after
    return after_turn(turns[after - 1] if after else None, after)


def recorded_after(turns: Sequence[Turn], start: EventId, base: int = 0) -> list[SessionEvent]:
    """The recorded events of ``turns`` (positions ``base + 1`` on) after ``start``."""
    told: list[SessionEvent] = []
    for offset, turn in enumerate(turns):
        position = base + offset + 1
        if position < start.turn:
            continue
        told += [e for e in recorded_events(turn, position) if e.id is not None and e.id > start]
    return told


def catch_up(
    turns: Sequence[Turn], start: EventId, held: Sequence[SessionEvent]
) -> list[SessionEvent]:
    """What a follow tells before the live events: the recorded events after
    ``start`` (from the loom) and the held ones (the log), in id order, each once."""
    by_id = {
        e.id: e
        for e in recorded_after(turns[max(start.turn - 1, 0) :], start, max(start.turn - 1, 0))
    }
    by_id.update((e.id, e) for e in held)
    return [by_id[i] for i in sorted(i for i in by_id if i is not None)]


def reset_event(after: EventId, oldest: EventId) -> SessionEvent:
    """What a client resuming after an event no longer held is told first."""
    data = {
        "type": "reset",
        "after": str(after),
        "oldest": str(oldest),
        "message": (
            f"events after {after} that were not recorded in a turn are no longer held "
            f"(the oldest held is {oldest}); the session's recorded events after {after} "
            "follow, then the live ones"
        ),
    }
    return SessionEvent("reset", data)


def cut_event(prompt_id: str, oldest: EventId) -> SessionEvent:
    """What a follower of a prompt's own stream is told first when the log no longer
    holds the prompt's first events (it told more than :data:`RESUMABLE_EVENTS`): the
    events that follow are not the prompt's whole stream."""
    data = {
        "type": "reset",
        "prompt_id": prompt_id,
        "oldest": str(oldest),
        "message": (
            f"prompt {prompt_id} told more events than a session holds "
            f"({RESUMABLE_EVENTS}); its first ones are no longer held (the oldest held "
            f"is {oldest}), so its stream cannot be told again whole: its turns are in "
            "the session's thread"
        ),
    }
    return SessionEvent("reset", data, prompt_id=prompt_id)


def dropped_event(last: EventId) -> SessionEvent:
    """What a watcher that fell :data:`WATCHER_BUFFER` events behind is told last."""
    data = {
        "type": "dropped",
        "last_event_id": str(last),
        "message": (
            f"this stream fell {WATCHER_BUFFER} events behind the session and was let go; "
            f"reconnect with Last-Event-ID: {last} for the rest"
        ),
    }
    return SessionEvent("dropped", data)


@attrs.define
class TurnIds:
    """The ids of a follow that reads a session's turns from the loom (``serve
    --db``): a turn's recorded events at its position, then what is told beside them
    (a child's pause, a question asked in place) at the next index."""

    turn: int
    """The position of the last turn told (the turns before the follow began)."""
    last: EventId = START

    def told(self, turn: Turn) -> list[SessionEvent]:
        """The next turn's recorded events, with their ids."""
        self.turn += 1
        events = recorded_events(turn, self.turn)
        self.last = events[-1].id or self.last
        return events

    def live(self, data: dict[str, Any]) -> SessionEvent:
        """An event told beside the turns, at the next index."""
        self.last = (
            EventId(self.turn, self.last.index + 1)
            if self.last.turn == self.turn
            else EventId(self.turn, 0)
        )
        return SessionEvent(data["type"], data, id=self.last)
