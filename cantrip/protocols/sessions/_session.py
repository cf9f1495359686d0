"""A served session's parts: the session itself (its entity, its user, its running and
waiting prompts, its event log and watchers), a prompt, and a watcher's bounded buffer.

Split from :mod:`._hub` (which admits, runs and cancels prompts over these) so each
module holds one job; nothing here starts a task.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from cantrip._core import Entity
from cantrip._gate import Gate
from cantrip._outcome import CastResult
from cantrip.distributed._work import CWD_TAG
from cantrip.llm._stream import Event
from cantrip.loom._model import Turn
from cantrip.memory._settings import USER_TAG
from cantrip.protocols.sessions._backend import ENTITY_PREFIX as ENTITY_PREFIX
from cantrip.protocols.sessions._backend import SESSION_PREFIX as SESSION_PREFIX
from cantrip.protocols.sessions._backend import SessionError as SessionError
from cantrip.protocols.sessions._backend import SessionEvent
from cantrip.protocols.sessions._backend import entity_id_for as entity_id_for
from cantrip.protocols.sessions._backend import session_id_for as session_id_for
from cantrip.protocols.sessions._idempotency import (
    KEY_TAG,
)
from cantrip.protocols.sessions._positions import WATCHER_BUFFER, EventLog
from cantrip.protocols.sessions._shapes import EVENT_TYPES as EVENT_TYPES  # re-exported
from cantrip.protocols.sessions._shapes import event_dict as event_dict
from cantrip.protocols.sessions._shapes import steered as steered
from cantrip.protocols.sessions._shapes import turn_dict as turn_dict


def cast_tags(key: str | None, user: str | None, cwd: str | None = None) -> dict[str, Any] | None:
    """A cast's tags: its idempotency key, its session's user and working directory,
    when there are."""
    tags: dict[str, Any] = {}
    if key is not None:
        tags[KEY_TAG] = key
    if user is not None:
        tags[USER_TAG] = user
    if cwd is not None:
        tags[CWD_TAG] = cwd
    return tags or None


def recorded_tag(turns: Sequence[Turn], tag: str) -> str | None:
    """What a session's casts recorded as ``tag`` (the latest cast's first turn's)."""
    for turn in reversed(turns):
        value = turn.extras.get(tag)
        if isinstance(value, str):
            return value
    return None


def recorded_user(turns: Sequence[Turn]) -> str | None:
    """The user a session's casts recorded (their first turns' ``user`` tag)."""
    return recorded_tag(turns, USER_TAG)


def not_running(session_id: str) -> SessionError:
    """A message sent to a session with no prompt running (both servers' 409)."""
    return SessionError(
        "not_running", f"session {session_id} is not running a prompt: send it as a prompt instead"
    )


def new_prompt_id() -> str:
    return "prompt-" + secrets.token_hex(8)


@attrs.define(eq=False)
class Prompt:
    """A prompt a session runs (or whose request is arriving): what a repeat with its
    key joins, and what a cancel that names it (by key or id) cuts off."""

    intent: str
    key: str | None
    before: str | None = None
    """The entity's leaf when the prompt began (``rollback`` returns there)."""
    id: str = attrs.field(factory=new_prompt_id)
    """Handed to the client at once (``Prompt-Id``), so a cancel can name this prompt."""
    cancel_requested: bool = False
    """A cancel named it (or found it arriving): it ends as it would start, with nothing
    recorded (:meth:`SessionHub._withdraw`)."""
    submitted: bool = False
    """Its request reached the backend's ``submit`` (an announced prompt is withdrawn
    from ``Session.arriving`` when its request ends only if it never did)."""
    waiting: bool = False
    """It waits its turn behind the session's running prompt (``enqueue``, or the
    interrupted one ending): a cancel finds it ``queued``, as on PostgreSQL."""
    offered: tuple[Gate, ...] = ()
    """The client's own tools (AG-UI's), offered to its cast as it starts."""
    done: trio.Event = attrs.field(factory=trio.Event)
    outcome: CastResult | None = None
    error: BaseException | None = None

    def matches(self, prompt_id: str | None, key: str | None) -> bool:
        """Whether a cancel naming ``prompt_id`` and/or ``key`` names this prompt."""
        if prompt_id is not None and prompt_id != self.id:
            return False
        if key is not None and key != self.key:
            return False
        return prompt_id is not None or key is not None


@attrs.frozen
class Admitted:
    """A prompt :meth:`SessionHub.admit` accepted, and what :meth:`SessionHub.run`
    is to do with it."""

    prompt: Prompt
    """The prompt cast, or joined (``join``: the open one with the same key)."""
    action: str
    """``cast``, ``join`` or ``replay`` (nothing is cast: the recorded result)."""
    recorded: CastResult | None = None
    """What a ``replay`` returns (None: the keyed prompt was cut off before it began)."""
    on_busy: str = "reject"


def key_reused(key: str) -> SessionError:
    return SessionError(
        "key_reused", f"Idempotency-Key {key!r} was used for a different prompt on this session"
    )


MAX_ARMED_KEYS = 64
"""Cancels naming a key not seen yet that one session keeps armed (the oldest go)."""
MAX_ENDED_PROMPTS = 256
"""Ended prompts' ids one session remembers, so a cancel naming one answers ``ended``
(the oldest go; beyond them, and after a restart, an unkeyed id is ``none``)."""


def now() -> float:
    """trio's clock (virtual under a MockClock); 0 outside a trio run."""
    try:
        return trio.current_time()
    except RuntimeError:
        return 0.0


@attrs.define(eq=False)
class Session:
    id: str
    entity: Entity
    user: str | None = None
    """The ``user`` tag of its casts (fixed at creation; after a restart read back
    from the tags its casts recorded)."""
    cwd: str | None = None
    """The ``cwd`` tag of its casts: the working directory it was created in (fixed
    at creation; after a restart read back like ``user``)."""
    running: trio.CancelScope | None = None
    sink: Callable[[Event], None] | None = None
    """The running prompt's own event sink."""
    subscribers: list[Watcher] = attrs.field(factory=list)
    """Live listeners (``follow``); each gets every event of every prompt, stamped."""
    log: EventLog = attrs.field(factory=EventLog)
    """The session's told events with their ids (issue 44): the latest are kept to
    resume from (:mod:`._positions`); set to the loom's present when adopted."""
    current: Prompt | None = None
    """The running prompt (set with ``running``)."""
    arriving: list[Prompt] = attrs.field(factory=list)
    """Prompt requests that have arrived but not begun (their body is being read)."""
    waiting: list[Prompt] = attrs.field(factory=list)
    """Prompts waiting their turn, in the order they came: served first to last (FIFO,
    as ``serve --db``'s queue serves an entity's work in id order)."""
    turn: trio.Event = attrs.field(factory=trio.Event)
    """Set (and replaced) whenever a prompt leaves ``waiting``: the next may go."""
    cancel_until: float | None = None
    """A cancel of the next prompt (asked for with ``next``) is armed until this time
    (trio clock): the prompt that would start by then records nothing."""
    armed_keys: dict[str, float] = attrs.field(factory=dict)
    """Cancels that named an Idempotency-Key no prompt had yet: key -> until when
    (trio clock) a prompt with that key is cut off as it starts."""
    keys: dict[str, str] | None = None
    """Idempotency key -> the id of its cast's first turn (built on first use)."""
    answering: str | None = None
    """The pause whose answer the session's cast is carrying out: a second answer to it
    meanwhile is a :class:`~cantrip.PauseError` (it was answered), not ``busy``."""
    ended: dict[str, str | None] = attrs.field(factory=dict)
    """The ids of the session's latest ended prompts -> their keys (at most
    ``MAX_ENDED_PROMPTS``): a cancel naming one is told ``ended``, as on PostgreSQL."""
    unstarted: dict[str, str] = attrs.field(factory=dict)
    """Keys of the latest prompts cut off before they started -> their intents (at most
    ``MAX_ENDED_PROMPTS``; nothing of them is recorded): a repeat replays the cut-off
    prompt, a cancel naming the key is ``ended``, as on PostgreSQL."""
    last_used: float = 0.0
    """trio time of the last request that named it (idle eviction, protocols._limits)."""
    steered: tuple[int, int] = (0, 0)
    """Steering messages the running cast took, and their bytes (:mod:`._steering`
    bounds them); a cast -- a prompt, or a paused one continued -- starts at zero."""

    @property
    def entity_id(self) -> str:
        return self.entity.id

    def dispatch(self, event: Event) -> None:
        """The entity's event sink: the event is stamped with its id and kept in the
        session's log, then goes to the prompt's sink and each watcher. A watcher
        whose buffer is full is dropped (told so when it reads on): the cast never
        waits for one."""
        if self.sink is not None:
            self.sink(event)
        prompt_id = self.current.id if self.current is not None else None
        told = self.log.record(event, self.entity.id, self._turns_since, prompt_id)
        for watcher in list(self.subscribers):
            for said in told:
                if not watcher.offer(said):
                    self.subscribers.remove(watcher)
                    break

    def _turns_since(self, turn_id: str | None) -> Sequence[Turn]:
        """The entity's turns recorded after ``turn_id`` (all of them for None)."""
        entity = self.entity
        if turn_id is None:
            return entity.turns
        return entity.loom.entity_turns_from(entity.id, turn_id)[1:]

    def prompt_ended(self, prompt: Prompt) -> None:
        """Remember that ``prompt`` ended (bounded: the oldest are forgotten)."""
        self.ended.pop(prompt.id, None)
        self.ended[prompt.id] = prompt.key
        while len(self.ended) > MAX_ENDED_PROMPTS:
            del self.ended[next(iter(self.ended))]

    def watch(self) -> Watcher:
        """A watcher of this session's events from now on (bounded: see
        :class:`Watcher`); close its ``events`` to stop watching."""
        self.subscribers[:] = [w for w in self.subscribers if w.open]
        watcher = Watcher()
        self.subscribers.append(watcher)
        return watcher

    @property
    def watched(self) -> bool:
        """Somebody follows this session now."""
        return any(w.open for w in self.subscribers)


class Watcher:
    """One follower of a session: a buffer of :data:`WATCHER_BUFFER` events. One that
    falls that far behind is closed and marked ``dropped`` -- its follower reads
    what was buffered, then is told so -- so a slow client never holds up the cast
    nor grows the server's memory."""

    def __init__(self, size: int | None = None) -> None:
        size = WATCHER_BUFFER if size is None else size
        self.send, self.events = trio.open_memory_channel[SessionEvent](size)
        self.dropped = False

    @property
    def open(self) -> bool:
        return self.send.statistics().open_receive_channels > 0 and not self.dropped

    def offer(self, event: SessionEvent) -> bool:
        """Hand it the event; False once it is gone (closed, or dropped now)."""
        try:
            self.send.send_nowait(event)
        except trio.WouldBlock:
            self.dropped = True
            self.send.close()
            return False
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    def close(self) -> None:
        self.send.close()
