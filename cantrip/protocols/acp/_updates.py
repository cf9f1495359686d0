"""An ACP prompt's events as ``session/update`` notifications: text and thinking
chunks, tool calls as they are announced, run and end, usage with the session's cost,
and a loaded session's history replayed (``session/load``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cantrip.llm._contract import plain_json
from cantrip.loom._loom import Loom
from cantrip.loom._model import GateCallRecord, Turn, result_text
from cantrip.loom._summary import cast_cost, cost, spawned_turns, turn_cost
from cantrip.loom._view import CHECKPOINT_PHASES
from cantrip.protocols.sessions._backend import SessionEvent

_KINDS = {
    "read": "read",
    "fetch": "fetch",
    "call_agent": "think",
    "call_agent_batch": "think",
    "js": "execute",
    "python": "execute",
    "bash": "execute",
}
"""ACP tool kinds (icons in a client) for gates and code tools cantrip knows."""


class Translator:
    """Turns one session's events (the session backend's :class:`SessionEvent`, the
    shapes every front end reads) into ACP session updates.

    Only the session's own entity is shown (its children appear as the
    delegation gate's tool call). Tool calls are announced once (``tool_call``,
    ``pending``), finalized (``in_progress``) and completed with their result
    (``completed`` / ``failed``); a code tool call that ran no further gate
    call is completed with the turn's observation when the turn is recorded.
    LLMs that do not stream still produce the same updates, from the complete
    message. A steering message a turn took is shown where it was inserted, as a
    ``user_message_chunk`` with its message id, when that turn is recorded; each
    model call's usage is a ``usage_update`` when the context window is known, with
    the session's cost so far (:attr:`cost`) when every price is known.

    ``recorded``: the backend tells recorded turns only (no token events: PostgreSQL's,
    ``capabilities.token_events``), so each turn is shown as ``session/load`` replays
    it, when it is recorded, with its call's usage.
    """

    def __init__(
        self, entity_id: str, context_window: int | None = None, *, recorded: bool = False
    ) -> None:
        self.entity_id = entity_id
        self.context_window = context_window
        self.recorded = recorded
        self.cost: float | None = None
        """USD the session has cost so far (its entity's calls and its children's),
        None while unknown: a ``usage_update`` then has no ``cost``, never a made-up
        zero. Seeded from the loom (:func:`session_cost`), then each call's cost is
        added as it is told (:meth:`charge`; one unknown makes it unknown for good):
        every ``usage`` event, a child's too; where only recorded turns are told, each
        turn's own, and its children's once the parent's next turn is told
        (:attr:`delegated`)."""
        self.delegated: list[Turn] = []
        """Recorded mode: checkpoints told whose children's cost is not counted yet
        (the front end reads it from the loom: :func:`children_cost`)."""
        self.announced: set[str] = set()
        self.open: dict[str, str] = {}
        self.step_text = False
        self.step_thinking = False
        self.any_text = False
        self.last_reason: str | None = None
        self.anonymous = 0
        self.sequence = 0
        """The turn being taken; tool call ids are ``<sequence>:<call id>``, unique in
        the session's thread (a provider's ids may repeat after a restart)."""

    def updates(self, told: SessionEvent) -> list[dict[str, Any]]:
        event = told.data
        kind = told.type
        if kind == "usage" and not self.recorded:  # a child's call costs the session too
            self.charge(event.get("cost_usd"))
        if event.get("entity_id") and event["entity_id"] != self.entity_id:
            return []
        if self.recorded:
            return self._recorded(told)
        if kind == "step_start":
            self.step_text = self.step_thinking = False
            self.sequence = int(event.get("sequence") or 0)
            self.anonymous = 0
        elif kind == "text_delta" and event.get("text"):
            self.step_text = self.any_text = True
            return [message(event["text"])]
        elif kind == "thinking_delta" and event.get("text"):
            self.step_thinking = True
            return [_chunk("agent_thought_chunk", event["text"])]
        elif kind == "tool_call":
            return self._tool_call(
                event["call_id"], event["name"], event.get("arguments"), bool(event.get("final"))
            )
        elif kind == "message_complete":
            return self._complete_message(event)
        elif kind == "usage":
            return self._usage(event.get("usage") or {})
        elif kind == "tool_result":
            return self._tool_result(GateCallRecord.from_dict(event["record"]))
        elif kind == "step_complete" and told.turn is not None:
            self.last_reason = told.turn.reason
            return [*inserted(told.turn), *self._close_open(told.turn)]
        elif kind == "final_response" and self.last_reason != "text":
            text = result_text(event.get("result"))
            prefix = "\n\n" if self.any_text else ""
            self.any_text = True
            return [message(prefix + text)]
        return []

    def _recorded(self, told: SessionEvent) -> list[dict[str, Any]]:
        """A recorded turn as ``session/load`` shows it (less the intent the client
        sent), then its call's usage; the rest a replay of the turn already showed."""
        if told.type != "step_complete" or told.turn is None:
            return []
        turn = told.turn
        self.sequence = turn.sequence
        self.charge(turn_cost(turn))
        if turn.extras.get("phase") in CHECKPOINT_PHASES:
            self.delegated.append(turn)
        shown = replay(turn, intent=False)
        meta = turn.metadata
        if meta.tokens_prompt or meta.tokens_completion:
            shown.extend(self._usage_update(meta.tokens_prompt + meta.tokens_completion))
        return shown

    def charge(self, cost: Any) -> None:
        """Add a call's cost (None or anything not a number: unknown, for good)."""
        if self.cost is not None:
            known = isinstance(cost, int | float) and not isinstance(cost, bool)
            self.cost = self.cost + float(cost) if known else None

    def _usage(self, usage: Mapping[str, Any]) -> list[dict[str, Any]]:
        used = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
        return self._usage_update(used)

    def _usage_update(self, used: int) -> list[dict[str, Any]]:
        """ACP's ``usage_update``: the tokens the context holds now (the last call's
        prompt and completion) out of the model's window, and the session's cost so far
        in USD where known; none when the window is not known (ACP requires it)."""
        if not self.context_window:
            return []
        update: dict[str, Any] = {
            "sessionUpdate": "usage_update",
            "used": used,
            "size": self.context_window,
        }
        if self.cost is not None:
            update["cost"] = {"amount": round(self.cost, 10), "currency": "USD"}
        return [update]

    def _tool_call(
        self, call_id: str, name: str, arguments: Any, final: bool
    ) -> list[dict[str, Any]]:
        raw = plain_json(arguments) if isinstance(arguments, Mapping) else None
        call_id = f"{self.sequence}:{call_id}"
        if call_id not in self.announced:
            self.announced.add(call_id)
            self.open[call_id] = name
            update: dict[str, Any] = {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": name,
                "kind": _KINDS.get(name, "other"),
                "status": "in_progress" if final else "pending",
            }
            if raw is not None:
                update["rawInput"] = raw
            return [update]
        if final:
            return [
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": "in_progress",
                    "rawInput": raw if raw is not None else {},
                }
            ]
        return []

    def _complete_message(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """What a non-streaming LLM did not stream, from the complete message."""
        out: list[dict[str, Any]] = []
        thinking, content = event.get("thinking"), event.get("content")
        if thinking and not self.step_thinking:
            out.append(_chunk("agent_thought_chunk", thinking))
        if content and not self.step_text:
            self.step_text = self.any_text = True
            out.append(message(content))
        for call in event.get("tool_calls") or ():
            if f"{self.sequence}:{call['id']}" not in self.announced:
                out.extend(self._tool_call(call["id"], call["name"], call.get("arguments"), True))
        return out

    def _tool_result(self, record: GateCallRecord) -> list[dict[str, Any]]:
        status = "completed" if record.status == "ok" else "failed"
        call_id = f"{self.sequence}:{record.tool_call_id}"
        content = [{"type": "content", "content": {"type": "text", "text": record.text}}]
        if record.tool_call_id is not None and call_id in self.open:
            del self.open[call_id]
            return [
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": status,
                    "rawOutput": plain_json(record.result),
                    "content": content,
                }
            ]
        # A gate called from code (its code tool call is the one announced).
        self.anonymous += 1
        return [
            {
                "sessionUpdate": "tool_call",
                "toolCallId": f"{self.sequence}:{record.gate}#{self.anonymous}",
                "title": record.gate,
                "kind": _KINDS.get(record.gate, "other"),
                "status": status,
                "rawInput": plain_json(record.args),
                "rawOutput": plain_json(record.result),
                "content": content,
            }
        ]

    def _close_open(self, turn: Turn) -> list[dict[str, Any]]:
        out = []
        for call_id in list(self.open):
            del self.open[call_id]
            failed = turn.is_error or turn.reason in ("cancelled", "timeout", "crashed")
            out.append(
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": "failed" if failed else "completed",
                    "content": [
                        {"type": "content", "content": {"type": "text", "text": turn.observation}}
                    ],
                }
            )
        return out


def inserted(turn: Turn) -> list[dict[str, Any]]:
    """The steering messages ``turn`` took (``extras["steering"]``), as the user
    messages they are, each with a message id that names where it was inserted
    (``<turn id>:steer:<n>``): the same id live and when replayed from the loom."""
    messages = turn.extras.get("steering")
    if not isinstance(messages, list):
        return []
    return [
        {**_chunk("user_message_chunk", str(text)), "messageId": f"{turn.id}:steer:{n}"}
        for n, text in enumerate(messages)
    ]


def _chunk(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def message(text: str) -> dict[str, Any]:
    return _chunk("agent_message_chunk", text)


def replay(turn: Turn, *, intent: bool = True) -> list[dict[str, Any]]:
    """A recorded turn as the updates a client shows for it (``session/load``; without
    its ``intent`` as it is told live: the client sent that)."""
    out: list[dict[str, Any]] = []
    if turn.intent and intent:
        out.append(_chunk("user_message_chunk", turn.intent))
    out.extend(inserted(turn))  # where they joined: before the turn's reply
    if turn.thinking:
        out.append(_chunk("agent_thought_chunk", turn.thinking))
    if turn.content:
        out.append(message(turn.content))
    recorded = {r.tool_call_id for r in turn.gate_calls}
    calls = {call.id for call in turn.tool_calls}
    for call in turn.tool_calls:
        if call.id not in recorded:  # a code tool call: its gates follow
            out.append(
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": f"{turn.sequence}:{call.id}",
                    "title": call.name,
                    "kind": _KINDS.get(call.name, "other"),
                    "status": "failed" if turn.is_error else "completed",
                    "rawInput": plain_json(call.arguments),
                    "content": [
                        {"type": "content", "content": {"type": "text", "text": turn.observation}}
                    ],
                }
            )
    anonymous = 0
    for record in turn.gate_calls:
        if record.tool_call_id is None or record.tool_call_id not in calls:
            anonymous += 1
            call_id = f"{turn.sequence}:{record.gate}#{anonymous}"
        else:
            call_id = f"{turn.sequence}:{record.tool_call_id}"
        out.append(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": record.gate,
                "kind": _KINDS.get(record.gate, "other"),
                "status": "completed" if record.status == "ok" else "failed",
                "rawInput": plain_json(record.args),
                "rawOutput": plain_json(record.result),
                "content": [{"type": "content", "content": {"type": "text", "text": record.text}}],
            }
        )
    if turn.terminated and turn.reason == "done":
        out.append(message(result_text(turn.result)))
    return out


def session_cost(loom: Loom, entity_id: str) -> float | None:
    """USD the session has cost as the loom records it: every call of its entity and of
    the entities it spawned (:func:`~cantrip.loom._summary.cast_cost`); None if any
    price is unknown. Read once per prompt, before it is submitted."""
    return cast_cost(loom.entity_turns(entity_id), loom)


def children_cost(loom: Loom, checkpoints: list[Turn]) -> float | None:
    """USD of the entities spawned at ``checkpoints`` (and theirs), as recorded."""
    return cost(spawned_turns(checkpoints, loom))
