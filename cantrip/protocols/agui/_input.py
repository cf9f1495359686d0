"""What an AG-UI ``RunAgentInput`` means to cantrip (SPEC.md "AG-UI"): the checks a
body passes before anything runs (a 400 otherwise), the prompt and the client's tool
results it carries, and how a resume entry answers a paused call -- the input side of
the one mapping, shared by both serve modes (:mod:`._run`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ag_ui.core import (
    Interrupt,
    ResumeEntry,
    RunAgentInput,
    ToolMessage,
    UserMessage,
)

from cantrip._approval import Decision, Pause, PauseError
from cantrip._client_gates import client_gates
from cantrip._errors import ConstructionError
from cantrip._gate import Gate
from cantrip._redact import get_logger
from cantrip.llm._contract import plain_json
from cantrip.protocols.asgi._body import nests_deeper
from cantrip.protocols.asgi._requests import request_id, validated
from cantrip.protocols.asgi._responses import HttpError

log = get_logger("cantrip.agui")


MAX_DEPTH = 64
"""How deep each member of a ``RunAgentInput`` (``state``, ``forwardedProps``,
``context``, ``messages``, ``tools``...) may nest objects and arrays. The state comes
back in every ``STATE_SNAPSHOT`` and the events are built by pydantic models, whose
serializer refuses values nested about 250 deep -- after ``RUN_STARTED`` had gone out,
which cut the stream. 64 is far beyond any application's state and far within what
every step of a run (validation, the redactor, serialization) handles."""

MAX_TOOLS = 128
"""How many front-end tools a run may offer: what the strictest provider takes in one
request (OpenAI's limit). Each is a gate the hub builds as the prompt starts; 12,000
of them -- within the body's megabyte -- held a thread 4 s (a quadratic check of their
names, now a set) and still ~0.2 s."""

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {"enum": ["approve", "deny", "edit"]},
        "reason": {"type": "string"},
        "args": {"type": "object"},
        "always": {"type": "boolean"},
    },
    "required": ["decision"],
}
"""What an approval's resume payload holds (``true``/``false`` are short for approve/deny)."""

QUESTION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    ]
}
"""What an ``ask_user`` question's resume payload holds: the answer's text."""


# -- the input -------------------------------------------------------------------------


def parse_input(body: Any) -> RunAgentInput:
    """The request as AG-UI's ``RunAgentInput`` (400 with one line if it is not one)."""
    if not isinstance(body, Mapping):
        raise HttpError(400, "bad_request", "the body must be an AG-UI RunAgentInput object")
    for name, value in body.items():
        if nests_deeper(value, MAX_DEPTH):
            what = name if len(name) <= 40 else name[:40] + "..."
            raise HttpError(
                400,
                "bad_request",
                f"{what} nests deeper than {MAX_DEPTH} levels of objects and arrays",
            )
    run: RunAgentInput = validated(RunAgentInput, body)
    request_id(run.thread_id, "threadId")
    request_id(run.run_id, "runId")
    for entry in run.resume or ():
        request_id(entry.interrupt_id, "resume.interruptId")
    if not run.resume and not intent_of(run) and not tool_results(run):
        raise HttpError(
            400,
            "bad_request",
            "the run needs a user message with text (or resume entries, or tool results)",
        )
    offered = run.tools or []
    if len(offered) > MAX_TOOLS:
        raise HttpError(
            400, "bad_request", f"a run may offer at most {MAX_TOOLS} tools ({len(offered)} given)"
        )
    offered_gates(run)  # the tools' names are checked before anything runs
    return run


def intent_of(run: RunAgentInput) -> str:
    """The text of the input's last user message ("" if there is none), followed by the
    input's ``context`` -- what the application tells the agent beside the message
    (CopilotKit's readables: the page, a selection): the model sees it with the prompt,
    and the loom records it with the intent."""
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            text = _content_text(message.content)
            if text and run.context:
                facts = "\n".join(f"- {item.description}: {item.value}" for item in run.context)
                text = f"{text}\n\nContext from the application:\n{facts}"
            return text
    return ""


def _content_text(content: Any) -> str:
    """A message's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    return "\n".join(
        getattr(part, "text", "") for part in content or () if getattr(part, "text", "")
    )


def tool_results(run: RunAgentInput) -> dict[str, str]:
    """The results of front-end tools the input carries: tool call id -> the text the
    client's tool answered (after the last user message: older ones were answered)."""
    results: dict[str, str] = {}
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            break
        if isinstance(message, ToolMessage):
            text = _content_text(message.content)
            if message.error:
                text = f"{text}\n{message.error}".strip() if text else f"error: {message.error}"
            results.setdefault(message.tool_call_id, text)
    return results


def client_answers(
    results: Mapping[str, str], pending: Iterable[Pause]
) -> list[tuple[Pause, Decision]]:
    """The open calls of the client's own tools that ``results`` (:func:`tool_results`)
    answer, in the order they wait, each with its answer."""
    return [
        (p, Decision.answer(results[p.tool_call_id])) for p in pending
        if p.kind == "question" and p.tool_call_id is not None and p.tool_call_id in results
    ]  # fmt: skip


def check_tools(run: RunAgentInput, gate_names: Iterable[str]) -> None:
    """A ``400`` if a tool the input offers has the name of one of the circle's gates."""
    taken = sorted({t.name for t in run.tools or ()} & set(gate_names))
    if taken:
        raise HttpError(
            400, "bad_request", f"the circle already has a gate named {', '.join(taken)}"
        )


def tool_definitions(run: RunAgentInput) -> list[dict[str, Any]]:
    """The input's ``tools`` (front-end tools: the client runs them) as plain
    definitions -- what a queued cast carries to its worker."""
    return [
        {"name": t.name, "description": t.description, "parameters": t.parameters}
        for t in run.tools or ()
    ]


def offered_gates(run: RunAgentInput) -> tuple[Gate, ...]:
    """The input's ``tools`` as gates the run's casts may call
    (:mod:`cantrip._client_gates`): a call pauses like an ``ask_user`` question, the run
    ends with the call, and the result the client sends with its next run is the
    call's observation. A name no provider takes, or given twice, is a 400."""
    try:
        return client_gates(tool_definitions(run))
    except ConstructionError as exc:
        raise HttpError(400, "bad_request", str(exc)) from None


def decision_for(pause: Pause | None, entry: ResumeEntry) -> Decision:
    """What a resume entry says about a pause (:data:`APPROVAL_SCHEMA`,
    :data:`QUESTION_SCHEMA`); a cancelled entry denies the call. ``pause`` None: one
    no longer open (an answer sent again): the payload alone says what it answers."""
    if entry.status == "cancelled":
        return Decision.deny("cancelled by the user")
    payload = entry.payload
    if isinstance(payload, Mapping) and "decision" in payload:
        return Decision.parse(payload)
    pause_id = entry.interrupt_id if pause is None else pause.pause_id
    asks = pause.kind == "question" if pause is not None else isinstance(payload, str | Mapping)
    if asks:
        if isinstance(payload, Mapping) and isinstance(payload.get("answer"), str):
            return Decision.answer(payload["answer"])
        if isinstance(payload, str):
            return Decision.answer(payload)
        raise PauseError(f"interrupt {pause_id} asks a question: answer it with text")
    if payload is True:
        return Decision.approve()
    if payload is False:
        return Decision.deny()
    raise PauseError(
        f"interrupt {pause_id} asks for approval: resume it with true, false "
        'or {"decision": "approve" | "deny" | "edit", ...}'
    )


def interrupt_for(pause: Pause, subagent: str | None = None) -> Interrupt:
    """A pause as an AG-UI interrupt; ``subagent``: the sub-agent run that waits on it
    (a ``call_agent`` child's, its entity id), None for the run's own entity."""
    if pause.kind == "question":
        return Interrupt(
            id=pause.pause_id,
            reason="question",
            message=pause.question or "",
            tool_call_id=pause.tool_call_id,
            response_schema=QUESTION_SCHEMA,
            subagent_run_id=subagent,
        )
    return Interrupt(
        id=pause.pause_id,
        reason="approval",
        message=f"{pause.gate} wants to run with {json.dumps(plain_json(pause.args))}",
        tool_call_id=pause.tool_call_id,
        response_schema=APPROVAL_SCHEMA,
        metadata={"gate": pause.gate, "args": plain_json(pause.args)},
        subagent_run_id=subagent,
    )


def run_key(run: RunAgentInput) -> str:
    """The idempotency key a run's prompt carries: one ``runId``, one cast."""
    return "agui-run:" + run.run_id


def thread_key(thread_id: str) -> str:
    """The idempotency key of the session a client's own thread id created."""
    return "agui-thread:" + thread_id
