"""Humans in the loop: which gate calls need a person, and what the person said.

A call that needs a human -- an approval (a gate the policy marks) or a
question (the ``ask_user`` gate) -- becomes a :class:`Pause`. The pause is a
checkpoint in the loom, like a delegation (SPEC.md "Pauses: humans in the
loop"): the turn is recorded
up to that call, with the pause as its pending marker, so a process may stop
while it waits and any later process can find it and answer it. The answer is a
:class:`Decision`. This module holds only these values and the policy; the
entity (``cantrip._core._pauses``) runs the mechanism.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import attrs

from cantrip._elicit import AnswerError, form_content
from cantrip._errors import CantripError, ConstructionError

Verdict = Literal["allow", "deny", "ask"]
PauseKind = Literal["approval", "question"]
DecisionKind = Literal["approve", "deny", "edit", "answer"]

PolicyFunction = Callable[[str, Mapping[str, Any]], Verdict]
"""``policy(gate_name, arguments) -> "allow" | "deny" | "ask"``."""


class PauseError(CantripError):
    """An answer that cannot be taken: unknown pause, already answered, wrong kind."""


def _frozen_args(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return dict(value or {})


@attrs.frozen
class Pause:
    """A gate call waiting for a human."""

    pause_id: str
    entity_id: str
    kind: PauseKind
    gate: str
    args: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_args)
    tool_call_id: str | None = None
    question: str | None = None
    """For ``ask_user``: what the entity asks."""
    checkpoint_id: str | None = None
    """The loom turn that records the turn up to this call, with this pause pending."""
    origin: str | None = None
    """Who asks when it is not the entity: ``"mcp:<server>"`` for an MCP server's
    elicitation during a call of ``gate`` (:mod:`cantrip._elicit`). Such a question
    waits in place: the call that asks is still running."""
    schema: Mapping[str, Any] | None = None
    """For a form (an elicitation's requested schema): the object the answer must be."""
    url: str | None = None
    """For a URL-mode elicitation: the page the user is asked to open (outside cantrip)."""

    def to_dict(self) -> dict[str, Any]:
        data = {
            "pause_id": self.pause_id,
            "entity_id": self.entity_id,
            "kind": self.kind,
            "gate": self.gate,
            "args": dict(self.args),
            "tool_call_id": self.tool_call_id,
            "question": self.question,
            "checkpoint_id": self.checkpoint_id,
        }
        if self.origin is not None:
            data["origin"] = self.origin
        if self.schema is not None:
            data["schema"] = dict(self.schema)
        if self.url is not None:
            data["url"] = self.url
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], checkpoint_id: str | None = None) -> Pause:
        return cls(
            pause_id=str(data["pause_id"]),
            entity_id=str(data["entity_id"]),
            kind=data.get("kind", "approval"),
            gate=str(data["gate"]),
            args=data.get("args") or {},
            tool_call_id=data.get("tool_call_id"),
            question=data.get("question"),
            checkpoint_id=checkpoint_id or data.get("checkpoint_id"),
            origin=data.get("origin"),
            schema=data.get("schema"),
            url=data.get("url"),
        )


def new_pause_id() -> str:
    return "pause-" + os.urandom(8).hex()


@attrs.frozen
class Decision:
    """What the human said.

    ``approve`` runs the gate once; ``deny`` gives the entity an ``is_error``
    observation ("denied by the user: <reason>"); ``edit`` runs the gate with
    the human's ``args`` (the loom keeps both); ``answer`` is the reply to an
    ``ask_user`` question. ``always`` (with approve) approves later calls of the
    same gate for the rest of this entity's life in this process.
    """

    kind: DecisionKind
    reason: str | None = None
    args: Mapping[str, Any] | None = None
    text: str | None = None
    always: bool = False

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("approve", "deny", "edit", "answer"):
            raise PauseError(f"a decision is approve, deny, edit or answer; not {self.kind!r}")
        if self.kind == "edit" and not isinstance(self.args, Mapping):
            raise PauseError("an edit decision needs the arguments to run the gate with")
        if self.kind == "answer" and not isinstance(self.text, str):
            raise PauseError("an answer decision needs the text of the answer")

    @classmethod
    def approve(cls, *, always: bool = False) -> Decision:
        return cls("approve", always=always)

    @classmethod
    def deny(cls, reason: str | None = None) -> Decision:
        return cls("deny", reason=reason)

    @classmethod
    def edit(cls, args: Mapping[str, Any]) -> Decision:
        return cls("edit", args=dict(args))

    @classmethod
    def answer(cls, text: str) -> Decision:
        return cls("answer", text=text)

    @classmethod
    def parse(cls, data: Mapping[str, Any] | Decision) -> Decision:
        """From the JSON a front end receives: ``{"decision": "approve", ...}``."""
        if isinstance(data, Decision):
            return data
        kind = data.get("decision")
        if kind not in ("approve", "deny", "edit", "answer"):
            raise PauseError(f"decision must be approve, deny, edit or answer; not {kind!r}")
        reason = data.get("reason")
        args = data.get("args")
        text = data.get("text", data.get("answer"))
        if reason is not None and not isinstance(reason, str):
            raise PauseError("reason must be a string")
        if args is not None and not isinstance(args, Mapping):
            raise PauseError("args must be an object")
        return cls(
            kind=kind,
            reason=reason,
            args=args,
            text=text if isinstance(text, str) else None,
            always=bool(data.get("always", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"decision": self.kind}
        if self.reason is not None:
            data["reason"] = self.reason
        if self.args is not None:
            data["args"] = dict(self.args)
        if self.text is not None:
            data["text"] = self.text
        if self.always:
            data["always"] = True
        return data


def check_decision(pause: Pause, decision: Decision) -> None:
    """A question takes an answer (or a refusal); an approval takes approve/deny/edit;
    a form's answer must fill the form (:func:`cantrip._elicit.form_content`)."""
    if pause.kind == "question" and decision.kind not in ("answer", "deny"):
        raise PauseError(f"pause {pause.pause_id} asks a question: answer it with text")
    if pause.schema is not None and decision.kind == "answer":
        try:
            form_content(pause.schema, decision.text or "")
        except AnswerError as exc:
            raise PauseError(f"pause {pause.pause_id} asks for a form: {exc}") from None
    if pause.kind == "approval" and decision.kind == "answer":
        raise PauseError(f"pause {pause.pause_id} asks for approval: approve, deny or edit")


def _patterns(value: Iterable[str]) -> tuple[str, ...]:
    patterns = tuple(value)
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ConstructionError(f"approve patterns are gate-name globs, not {pattern!r}")
    return patterns


@attrs.frozen
class ApprovalPolicy:
    """Which gate calls need a human first.

    ``patterns`` are globs over gate names (``"bash"``, ``"mcp_*"``); ``function``
    sees the gate name and arguments and answers allow / deny / ask, overriding
    the patterns. ``timeout_s`` denies a pending approval with the reason
    "timed out" when nobody answers in time.
    """

    patterns: tuple[str, ...] = attrs.field(default=(), converter=_patterns)
    function: PolicyFunction | None = attrs.field(default=None, eq=False)
    timeout_s: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConstructionError("approval_timeout_s must be a positive number of seconds")

    @property
    def active(self) -> bool:
        return bool(self.patterns) or self.function is not None

    def verdict(self, gate: str, args: Mapping[str, Any]) -> Verdict:
        if self.function is not None:
            verdict = self.function(gate, args)
            if verdict not in ("allow", "deny", "ask"):
                raise ConstructionError(
                    f"the approval policy answered {verdict!r} for {gate!r}: "
                    "it must answer 'allow', 'deny' or 'ask'"
                )
            return verdict
        if any(fnmatch.fnmatchcase(gate, pattern) for pattern in self.patterns):
            return "ask"
        return "allow"
