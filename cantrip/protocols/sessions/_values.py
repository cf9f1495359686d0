"""The values of the session seam: what a
:class:`~cantrip.protocols.sessions._backend.SessionBackend` takes and answers (ids,
sessions, prompts, events, tasks, health, capabilities), its one error
(:class:`SessionError`) and the checks of what a client sends (user, cwd).

Apart from :mod:`cantrip.protocols.sessions._backend` because they are plain data
and the rules on it: every backend, front end and test builds and reads them, while
the Protocol there only says which calls a backend answers with them (and why the
seam is shaped so, in its docstring). ``_backend`` re-exports every name here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal, get_args

import attrs

from cantrip._outcome import CastResult
from cantrip.loom._model import Turn
from cantrip.memory._model import MemoryStoreError, check_namespace

SESSION_PREFIX = "session-"
"""A session's id begins so (the rest names its entity, ``entity-...``)."""
ENTITY_PREFIX = "entity-"


def session_id_for(entity_id: str) -> str:
    """The session id of a top-level entity (the same in every backend)."""
    return SESSION_PREFIX + entity_id.removeprefix(ENTITY_PREFIX)


def entity_id_for(session_id: str) -> str:
    """The entity behind a session id; an entity id is accepted as is."""
    if session_id.startswith(ENTITY_PREFIX):
        return session_id
    return ENTITY_PREFIX + session_id.removeprefix(SESSION_PREFIX)


class SessionError(Exception):
    """A request about a session that cannot be served; ``kind`` says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        """not_found, busy, not_running, full, key_reused, bad_tools, overloaded or
        shutting_down (and ``cast_failed`` from :meth:`SessionBackend.result`)."""
        self.message = message


TaskState = Literal["open", "ended", "failed"]
"""The state of a task's current prompt: running or waiting its turn, ended (its
result dict says how), or failed for good (``failure`` says why)."""

MAX_TASKS = 1000
"""Tasks a backend that keeps them in memory keeps (the oldest settled go first)."""
BusyPolicy = Literal["reject", "enqueue", "interrupt", "rollback"]
"""What a prompt does when its session is running one (double-texting)."""
BUSY_POLICIES: tuple[BusyPolicy, ...] = get_args(BusyPolicy)

CancelTarget = Literal["running", "starting", "queued", "next", "ended", "none"]


@attrs.frozen
class SessionInfo:
    """A session: its id, its entity, whether a prompt of it is open, its turns."""

    session_id: str
    entity_id: str
    running: bool
    turns: int
    user: str | None = None
    """The user its casts are for (their ``user`` tag: a memory namespace's ``{user}``),
    fixed when the session is created."""
    cwd: str | None = None
    """The working directory it was created in (ACP's ``session/new``, the HTTP API's
    ``POST /sessions``), fixed when the session is created; its casts record it as
    their ``cwd`` tag."""

    def to_dict(self) -> dict[str, Any]:
        """The API's ``SessionInfo`` shape (``user`` and ``cwd`` only when the session
        has one)."""
        data = attrs.asdict(self)
        for optional in ("user", "cwd"):
            if data[optional] is None:
                del data[optional]
        return data


def check_user(user: str | None) -> str | None:
    """A session's user as given, or ``bad_request`` saying what is wrong: it fills a
    memory namespace part, so it is checked as one (not empty, at most
    ``MAX_PART_CHARS``, no control characters, no secret) when the session is made,
    not at its first cast."""
    if user is None:
        return None
    try:
        check_namespace((user,))
    except MemoryStoreError as exc:
        raise SessionError("bad_request", f"user: {exc}") from None
    return user


MAX_CWD_CHARS = 4096
CWD_SCHEMA: dict[str, Any] = {
    "minLength": 1,
    "maxLength": MAX_CWD_CHARS,
    "pattern": "^/[^\\x00-\\x1f\\x7f]*$",
}
"""What :func:`check_cwd` accepts, as JSON Schema says it (the HTTP API's document):
a description only -- :func:`check_cwd` is the one check, wherever a cwd arrives
(ACP's ``session/new``, ``POST /sessions``); ``tests/test_http_cwd.py`` holds the two
to agreeing."""


def check_cwd(cwd: str | None) -> str | None:
    """A session's working directory as given, or ``bad_request`` saying what is wrong:
    an absolute path of at most :data:`MAX_CWD_CHARS` characters, none a control
    character (it is recorded in the loom and listed back). Every backend's ``create``
    checks it before anything is made."""
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd:
        raise SessionError("bad_request", "cwd must be a non-empty string")
    if len(cwd) > MAX_CWD_CHARS:
        raise SessionError("bad_request", f"cwd is longer than {MAX_CWD_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in cwd):
        raise SessionError("bad_request", "cwd holds a control character")
    if not os.path.isabs(cwd):
        raise SessionError("bad_request", "cwd must be an absolute path")
    return cwd


def same_user(session_id: str, has: str | None, asked: str | None) -> None:
    """Refuse (``user_conflict``) a create whose key names a session of another user:
    a session's user is fixed at creation, so no client switches it."""
    if asked is not None and asked != has:
        raise SessionError(
            "user_conflict",
            f"session {session_id} was created for another user (a session's user is "
            "fixed when it is created)",
        )


TITLE_CHARS = 80
"""A session summary's title: its first intent, cut to this many characters."""


@attrs.frozen
class SessionSummary:
    """A session as a list shows it (``SessionBackend.summaries``, :mod:`._summaries`)."""

    session_id: str
    title: str | None
    """Its first intent (cut to :data:`TITLE_CHARS`); None before its first prompt."""
    updated_at: str | None
    """Its latest turn's time, else its entity's creation (None: neither recorded)."""
    cwd: str | None = None
    """Where it was created (its casts' ``cwd`` tag); None: not recorded."""


SessionRef = str | SessionInfo
"""How a call names a session: its id, or the :class:`SessionInfo` the caller's
:meth:`SessionBackend.find` returned in this request -- then the backend takes it as
read and reads the session no second time (on PostgreSQL each read is a transaction:
a prompt read its session three times before, issue 46)."""


def session_id_of(session: SessionRef) -> str:
    """The id a :data:`SessionRef` names."""
    return session if isinstance(session, str) else session.session_id


@attrs.frozen
class Submitted:
    """A prompt the backend accepted: running, or waiting its turn."""

    prompt_id: str
    """What :meth:`SessionBackend.cancel` and :meth:`SessionBackend.result` name it by."""
    session_id: str
    replayed: bool = False
    """Its idempotency key named a prompt seen before: nothing new was started."""


@attrs.frozen
class PromptOutcome:
    """How a prompt (or an answer's continuation) ended."""

    prompt_id: str
    cast: CastResult | None
    """None: it was cut off before it recorded a turn."""
    undelivered: tuple[str, ...] = ()
    """Steering messages no turn took (the cast ended first, or never began)."""


@attrs.frozen
class Cancelled:
    """What a cancel cut off, or will (the API's ``Cancelled`` answer)."""

    cancelled: bool
    target: CancelTarget
    prompt_id: str | None = None
    idempotency_key: str | None = None
    intent: str | None = None
    sticky_s: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cancelled:
        return cls(
            cancelled=bool(data["cancelled"]),
            target=data["target"],
            prompt_id=data.get("prompt_id"),
            idempotency_key=data.get("idempotency_key"),
            intent=data.get("intent"),
            sticky_s=data.get("sticky_s"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The API's shape: what a cancel cut off says its id, intent and key (even
        when unknown yet: null); other answers carry only what they name."""
        kept = {"cancelled", "prompt_id", "intent", "idempotency_key"} if self.cancelled else set()
        return {k: v for k, v in attrs.asdict(self).items() if v is not None or k in kept}


@attrs.frozen(order=True)
class EventId:
    """An event's place in its session (:mod:`._positions` says what it means)."""

    turn: int
    index: int

    def __str__(self) -> str:
        return f"{self.turn}.{self.index}"

    def next(self) -> EventId:
        """The id of the event told after this one in the same turn."""
        return EventId(self.turn, self.index + 1)


@attrs.frozen
class SessionEvent:
    """One event of a session, in the JSON shape streams carry
    (:func:`~cantrip.protocols.sessions._hub.event_dict`)."""

    type: str
    data: dict[str, Any]
    position: int | None = None
    """For a recorded turn (``step_complete``): how many of the session's turns there
    are up to it -- follow from here to resume after it. None for what is not a turn."""
    turn: Turn | None = None
    id: EventId | None = None
    """Where it stands in the session (:mod:`._positions`): what a stream sends as the
    SSE ``id`` and a client resumes after. None for what is not one of the session's
    events (a ``reset`` or ``dropped`` notice)."""
    prompt_id: str | None = None
    """The prompt whose cast told it, where the backend knows (in process)."""


@attrs.frozen
class TaskRecord:
    """A task recorded beside a prompt (an A2A task), with its prompt's state now."""

    task_id: str
    session_id: str
    prompt_id: str
    """The prompt the task follows now: the one submitted, then each answer's
    continuation."""
    messages: tuple[str, ...]
    """What the client sent for it, in order (each a JSON text the protocol wrote)."""
    seq: int
    """Creation order among the backend's tasks (newer is larger)."""
    canceled: bool
    """Cancelled while it waited for input (its pause stays in the loom)."""
    updated: float
    """When it (or its prompt) last changed, seconds since the epoch."""
    state: TaskState
    result: dict[str, Any] | None = None
    """Once ``ended``: the prompt's redacted result dict
    (:func:`~cantrip._outcome.result_dict`; None: cut off before its first turn)."""
    failure: str | None = None
    """Once ``failed``: why, for the client."""


@attrs.frozen
class Health:
    mode: str
    running: int
    """Prompts running (in process) or waited on (at this replica)."""
    sessions: int
    persistent: bool


def _offer(doc: str) -> Any:
    """A capability: a flag, with the sentence the docs' table of modes shows for it."""
    return attrs.field(metadata={"doc": doc})


@attrs.frozen
class Capabilities:
    """What a backend offers beyond the contract every backend keeps: the one place a
    mode's missing feature is declared. The docs' table of modes is generated from it
    (:func:`capabilities_table`, each flag's ``doc``), and ``tests/test_docs.py`` fails
    when the page's table is not what it renders."""

    mode: str
    token_events: bool = _offer(
        "Event streams carry token deltas, tool calls and usage as they happen "
        "(not only each recorded turn)"
    )
    a2a_push: bool = _offer(
        "A2A push notifications (a webhook's credentials live in the serving process's memory)"
    )
    viewer_fork: bool = _offer(
        "The browser viewer forks a session from a turn (`POST /api/fork`); without it "
        "the viewer is read-only and a fork is a `501`"
    )
    durable_prompt_ids: bool = _offer(
        "Every prompt id (an answer's continuation's too) is known to every process "
        "serving the sessions, and after a restart"
    )
    shared: bool = _offer("Several processes (replicas) serve the same sessions")


def capabilities_table(columns: Sequence[tuple[str, Capabilities]]) -> str:
    """The markdown table of what each mode offers: a row per capability (its ``doc``),
    a column per ``(heading, capabilities)``."""
    head = ["What it offers", *(heading for heading, _ in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for field in attrs.fields(Capabilities):
        if field.name == "mode":
            continue
        doc = field.metadata.get("doc")
        if not doc:
            raise ValueError(f"capability {field.name!r} has no doc for the table of modes")
        cells = ["yes" if getattr(c, field.name) else "no" for _, c in columns]
        lines.append(f"| {doc} (`{field.name}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
