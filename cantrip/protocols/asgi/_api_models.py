"""The HTTP API's models: what goes in and out of ``cantrip serve``, as pydantic models.

Why apart from :mod:`._openapi`: a handler validates a body with these (the same
:class:`PromptRequest` for every prompt the server takes), and the OpenAPI document is
built from them -- the two uses share the models, not the document's builder. Pydantic
emits JSON Schema 2020-12, the schema dialect of OpenAPI 3.1.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema, WithJsonSchema

from cantrip.protocols.sessions._ids import client_id
from cantrip.protocols.sessions._values import CWD_SCHEMA

Text = Annotated[str, Field(pattern=r"^[^\x00]*[^\s\x00][^\x00]*$")]
"""Prompt text: something that is not whitespace, and no NUL (U+0000), which PostgreSQL
text cannot hold (issue 28.5; the server refuses it in any body string)."""
NoNul = Annotated[str, Field(pattern=r"^[^\x00]*$")]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextBlock(BaseModel):
    """An ACP text content block."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: Text


class EmbeddedText(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: Text
    uri: NoNul | None = None


class ResourceBlock(BaseModel):
    """An ACP embedded resource whose text is part of the prompt."""

    model_config = ConfigDict(extra="allow")
    type: Literal["resource"]
    resource: EmbeddedText


Block = TextBlock | ResourceBlock | Text
Blocks = Annotated[list[Block], Field(min_length=1)]


class PromptRequest(_In):
    """A prompt: one cast on the session's entity. Give exactly one of the fields."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "minProperties": 1,
            "maxProperties": 1,
        },
    )
    prompt: Text | Blocks | SkipJsonSchema[None] = Field(default=None, examples=["Book a flight"])
    """Text, or ACP content blocks (text and embedded resources are read)."""
    intent: Text | SkipJsonSchema[None] = None
    text: Text | SkipJsonSchema[None] = None
    content: Blocks | SkipJsonSchema[None] = None

    @pydantic.model_validator(mode="after")
    def _one_field(self) -> PromptRequest:
        given = [k for k in ("prompt", "intent", "text", "content") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of prompt, intent, text or content")
        return self

    def as_params(self) -> dict[str, Any]:
        """The prompt in the shape ACP's ``prompt_text`` reads."""
        if self.prompt is not None:
            return {"prompt": _plain(self.prompt)}
        if self.content is not None:
            return {"content": _plain(self.content)}
        return {"prompt": self.intent if self.intent is not None else self.text}


def _plain(value: str | list[Block]) -> Any:
    if isinstance(value, str):
        return value
    return [b if isinstance(b, str) else b.model_dump() for b in value]


class CreateSession(_In):
    """``POST /sessions``: an empty body, ``{}``, or the user the session is for and the
    working directory it works in."""

    user: (
        SkipJsonSchema[None]
        | Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")]
    ) = Field(default=None, examples=["alice"])
    """Who the session's casts are for: their ``user`` tag, which fills a memory
    namespace's ``{user}``. Fixed when the session is made (no control characters)."""
    cwd: Annotated[str | None, WithJsonSchema({"type": "string", **CWD_SCHEMA})] = Field(
        default=None, examples=["/home/alice/project"]
    )
    """The working directory the session works in, as ACP's ``session/new`` gives one:
    its casts' ``cwd`` tag, fixed when the session is made. Checked by the backend's
    ``create`` (``check_cwd``: absolute, at most 4,096 characters, no control
    characters), the schema only describing it: 400 ``bad_request`` otherwise, and
    nothing is made."""


_NO_NUL: dict[str, Any] = {"pattern": "^[^\\x00]+$"}
"""What the schema says of a client's id (``client_id`` checks it, and what JSON Schema
cannot say: valid Unicode)."""


class CancelRequest(_In):
    """What a cancel targets (an empty body: the running prompt, if any). Name a prompt
    by ``prompt_id`` (the ``Prompt-Id`` its answer and first stream event carry) or by
    its ``idempotency_key``; or ask with ``next`` for the next prompt to start within a
    few seconds to be cut off. A name and ``next`` together are refused."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "not": {
                "required": ["next"],
                "properties": {"next": {"const": True}},
                "anyOf": [{"required": ["prompt_id"]}, {"required": ["idempotency_key"]}],
            }
        },
    )

    # A name that no prompt has (or can have) simply matches none; but it is a client's
    # id, so no NUL (published) and valid Unicode (``_a_client_id``; JSON Schema cannot
    # say "no unpaired surrogate").
    prompt_id: str | SkipJsonSchema[None] = Field(
        default=None, min_length=1, max_length=100, json_schema_extra=_NO_NUL
    )
    idempotency_key: str | SkipJsonSchema[None] = Field(
        default=None, min_length=1, max_length=255, json_schema_extra=_NO_NUL
    )
    next: bool = False

    @pydantic.field_validator("prompt_id", "idempotency_key")
    @classmethod
    def _a_client_id(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        """A name is a client's id like any other (SPEC.md "Ids from clients")."""
        return None if value is None else client_id(value, str(info.field_name))

    @pydantic.model_validator(mode="after")
    def _one_target(self) -> CancelRequest:
        if self.next and (self.prompt_id is not None or self.idempotency_key is not None):
            raise ValueError("name a prompt or ask for the next one, not both")
        return self


class AnswerRequest(_In):
    """The human's answer to a pause: approve, deny (with a reason), edit (with the
    arguments to run the gate with), or answer (the text of a reply to ``ask_user``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"decision": {"const": "edit"}}},
                    "then": {"required": ["args"]},
                },
                {
                    "if": {"properties": {"decision": {"const": "answer"}}},
                    "then": {"required": ["text"]},
                },
            ]
        },
    )

    decision: Literal["approve", "deny", "edit", "answer"]
    reason: NoNul | SkipJsonSchema[None] = Field(default=None, max_length=10_000)
    args: dict[str, Any] | SkipJsonSchema[None] = None
    text: NoNul | SkipJsonSchema[None] = Field(default=None, max_length=50_000)
    """At most 50,000 characters: so that one over the limit, even JSON-escaped at 12 bytes
    a character, is still under the 1 MiB body limit and answered 400, not 413."""
    always: bool = False
    """With approve: later calls of the same gate are approved too (this process)."""

    @pydantic.model_validator(mode="after")
    def _complete(self) -> AnswerRequest:
        if self.decision == "edit" and self.args is None:
            raise ValueError("an edit needs args: the arguments to run the gate with")
        if self.decision == "answer" and self.text is None:
            raise ValueError("an answer needs text")
        return self

    def decision_value(self) -> Any:
        from cantrip._approval import Decision

        return Decision(
            self.decision, reason=self.reason, args=self.args, text=self.text, always=self.always
        )


class PauseInfo(_Out):
    pause_id: str
    entity_id: str
    kind: Literal["approval", "question"]
    gate: str
    args: dict[str, Any]
    tool_call_id: str | None
    question: str | None
    checkpoint_id: str | None
    origin: str | SkipJsonSchema[None] = None
    """Who asks when not the entity: ``mcp:<server>`` for an MCP server's elicitation."""
    form: dict[str, Any] | SkipJsonSchema[None] = Field(default=None, alias="schema")
    """The JSON Schema a form's answer must fill (the answer's text is its JSON object,
    or the value of its one field)."""
    url: str | SkipJsonSchema[None] = None
    """A page the user is asked to open (an elicitation in URL mode)."""


class PendingBody(_Out):
    session_id: str
    entity_id: str
    running: bool
    turns: int
    user: SkipJsonSchema[None] | str = None
    cwd: SkipJsonSchema[None] | str = None
    pending: list[PauseInfo]


class Answered(_Out):
    answered: bool
    pause_id: str


class ErrorDetail(_Out):
    code: str
    message: str


class ErrorBody(_Out):
    error: ErrorDetail


class Health(_Out):
    ok: bool
    mode: Literal["process", "db"] = "process"
    """``process``: the server runs the entities; ``db``: a ``serve --db`` replica,
    the entities run on ``cantrip worker`` processes."""
    running: int
    """Prompts running now (``db``: prompts this replica waits on)."""
    cantrip: str
    medium: str
    gates: list[str]
    persistent: bool
    sessions: int


class SessionInfo(_Out):
    session_id: str
    entity_id: str
    running: bool
    turns: int
    user: SkipJsonSchema[None] | str = None
    """The user the session was created for (absent: none)."""
    cwd: SkipJsonSchema[None] | str = None
    """The working directory the session was created with (absent: none)."""


class SessionList(_Out):
    sessions: list[SessionInfo]


class ThreadBody(_Out):
    session_id: str
    entity_id: str
    running: bool
    user: SkipJsonSchema[None] | str = None
    cwd: SkipJsonSchema[None] | str = None
    turns: list[dict[str, Any]]
    """The session's turns, root first, as ``cantrip loom export`` writes them."""


class GuardrailInfo(_Out):
    check: str
    on: Literal["input", "output", "call", "result"]
    why: str
    gate: str | SkipJsonSchema[None] = None


class PromptResult(_Out):
    result: Any = None
    terminated: bool
    truncated: bool
    reason: str | None
    turns: int
    entity_id: str | None
    usage: dict[str, Any] | None
    summary: str | None
    stop_reason: Literal["end_turn", "max_tokens", "max_turn_requests", "cancelled", "refusal"]
    session_id: str
    prompt_id: str | SkipJsonSchema[None] = None
    """The id the server gave this prompt (also its ``Prompt-Id`` header)."""
    pending: list[PauseInfo] | SkipJsonSchema[None] = None
    """A cast that met a call needing a human ends ``paused``: answer each with
    ``POST /sessions/{id}/pending/{pause_id}``."""
    cost_usd: float | None = None
    """USD the cast (and the casts it spawned) spent; null when a price is unknown."""
    partial: str | None = None
    """For a cast cut off by the output-token limit: the text written so far."""
    undelivered: list[str] | SkipJsonSchema[None] = None
    """Messages sent to this prompt (``/messages``) that arrived as it ended, too late
    to join a turn."""
    guardrail: GuardrailInfo | SkipJsonSchema[None] = None
    """A cast a guardrail ended (reason ``guardrail``, stop_reason ``refusal``): which
    check, on what, and why."""


class SteerRequest(_In):
    """A message for the running prompt: it joins the cast's next turn."""

    text: Text = Field(examples=["Also check the return flight"])


class Deleted(_Out):
    session_id: str
    deleted: Literal[True] = True
    """The session's whole tree left the loom (by the retention rule): no later
    request finds it."""


class Steered(_Out):
    accepted: bool
    joins: Literal["next_turn"] = "next_turn"
    """Where the message goes: before the cast's next utterance, recorded in that turn.
    One that arrives as the cast ends is reported in the prompt's result
    (``undelivered``)."""


ON_BUSY = ("reject", "enqueue", "interrupt", "rollback")
"""What a prompt does when the session is already running one (double-texting)."""


class Cancelled(_Out):
    cancelled: bool
    """Whether a prompt was cut off (or, ``starting``, will be as it starts)."""
    target: Literal["running", "starting", "queued", "next", "ended", "none"]
    """What the cancel applied to: the running prompt, one whose request is arriving,
    one waiting its turn (``queued``: behind the running prompt, or for a worker under
    ``serve --db``); ``next``: armed for the next prompt to
    start within ``sticky_s`` (asked for with ``next``, or the prompt that comes with
    the Idempotency-Key named); ``ended``: the prompt named has ended (read its
    result); ``none``: nothing was running, or the prompt named is not known --
    nothing was cancelled."""
    prompt_id: str | None = None
    """The prompt cancelled (or named)."""
    intent: str | None = None
    """The prompt that was cancelled (``target: running`` or ``queued``)."""
    idempotency_key: str | None = None
    """Its Idempotency-Key, if it had one."""
    sticky_s: float | None = None
    """``target: next``: for how many seconds the cancel waits for a prompt to start."""


# -- the document ---------------------------------------------------------------------------
