"""A pause asked of an ACP client: an approval as ``session/request_permission``, a
question as ``elicitation/create`` (ACP v1.7's elicitation) where the client advertised
the mode it needs, and otherwise the fallbacks ACP leaves (a yes/no form or a page to
open asked as allow / reject; anything else declined, said to the model).

Approvals stay ``session/request_permission``: it is ACP's approval of a tool call
(its options allow / reject, once or always, are what :class:`Decision` carries), and
elicitation's own text reserves it for information a person supplies. What the client
answers becomes a :class:`Decision`; the front end hands it to the session backend.

The v2 draft keeps the method and its answer but reshapes the request: the prompt's own
``title`` and the tool call as its ``subject`` (``{"type": "tool_call", "toolCall":
...}``) instead of v1's ``toolCall``; a v2 client rejects v1's shape as invalid params,
so a connection that negotiated v2 is asked in v2's (``v2=True``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cantrip._approval import Decision, Pause
from cantrip._elicit import yes_no_field
from cantrip.llm._contract import plain_json
from cantrip.protocols.acp._rpc import RpcError

Request = Callable[[str, Mapping[str, Any]], Awaitable[Any]]
"""Send the client a JSON-RPC request and wait for its result (``RpcError`` if it
answers with an error)."""

ANSWER_FIELD = "answer"
"""The one field of the form an ``ask_user`` question is asked with."""


def elicitation_modes(params: Mapping[str, Any]) -> frozenset[str]:
    """The elicitation modes an ``initialize`` request advertises: a mode is supported
    only when its object is present and not null (ACP differs from MCP here)."""
    caps = params.get("clientCapabilities")
    elicitation = caps.get("elicitation") if isinstance(caps, Mapping) else None
    if not isinstance(elicitation, Mapping):
        return frozenset()
    return frozenset(m for m in ("form", "url") if isinstance(elicitation.get(m), Mapping))


async def ask(
    request: Request, session_id: str, pause: Pause, modes: frozenset[str], *, v2: bool = False
) -> Decision:
    """What the client says about ``pause`` (asked in the v2 draft's shapes if ``v2``)."""
    if pause.kind != "question":
        return await _permission(request, session_id, pause, v2=v2)
    if pause.url is not None and "url" in modes:
        return await _elicit_url(request, session_id, pause)
    if pause.url is None and "form" in modes:
        return await _elicit_form(request, session_id, pause)
    return await _consent(request, session_id, pause, v2=v2)


def _scope(session_id: str, pause: Pause) -> dict[str, Any]:
    scope: dict[str, Any] = {"sessionId": session_id}
    if pause.tool_call_id is not None:
        scope["toolCallId"] = pause.tool_call_id
    return scope


def _message(pause: Pause) -> str:
    question = pause.question or f"{pause.gate} asks for an answer"
    return f"{pause.origin} asks: {question}" if pause.origin is not None else question


async def _elicit_form(request: Request, session_id: str, pause: Pause) -> Decision:
    """A question as a form: an MCP server's requested schema as it is, an
    ``ask_user`` question as one required text field."""
    schema: Mapping[str, Any] = pause.schema or {
        "type": "object",
        "properties": {ANSWER_FIELD: {"type": "string", "title": pause.question or "Answer"}},
        "required": [ANSWER_FIELD],
    }
    params = {
        **_scope(session_id, pause),
        "mode": "form",
        "message": _message(pause)[:2000],
        "requestedSchema": plain_json(schema),
    }
    answer = await _request(request, "elicitation/create", params)
    if answer is None:
        return Decision.deny("the client could not ask")
    action = answer.get("action")
    content = answer.get("content")
    if action == "accept" and isinstance(content, Mapping):
        if pause.schema is None:
            return Decision.answer(str(content.get(ANSWER_FIELD, "")))
        return Decision.answer(json.dumps(plain_json(content)))
    if action == "decline":
        return Decision.deny("declined in the editor")
    return Decision.deny("the question was dismissed in the editor")


async def _elicit_url(request: Request, session_id: str, pause: Pause) -> Decision:
    """A page the user is asked to open (an MCP server's URL elicitation)."""
    params = {
        **_scope(session_id, pause),
        "mode": "url",
        "elicitationId": pause.pause_id,
        "url": pause.url,
        "message": _message(pause)[:2000],
    }
    answer = await _request(request, "elicitation/create", params)
    if answer is not None and answer.get("action") == "accept":
        return Decision.answer("ok")
    return Decision.deny("declined in the editor")


async def _request(request: Request, method: str, params: Mapping[str, Any]) -> Any:
    """The client's answer, or None when it answered with an error."""
    try:
        answer = await request(method, params)
    except RpcError:
        return None
    return answer if isinstance(answer, Mapping) else None


async def _permission(request: Request, session_id: str, pause: Pause, *, v2: bool) -> Decision:
    """An approval: allow or reject, once or always."""
    arguments = json.dumps(plain_json(pause.args), ensure_ascii=False, default=str)
    tool_call = {
        "toolCallId": pause.tool_call_id or pause.pause_id,
        "title": f"{pause.gate}({arguments[:200]})",
        "kind": "execute",
        "status": "pending",
        "rawInput": plain_json(pause.args),
    }
    options = [
        {"optionId": kind, "name": name, "kind": kind}
        for kind, name in (
            ("allow_once", "Allow"),
            ("allow_always", f"Always allow {pause.gate}"),
            ("reject_once", "Reject"),
            ("reject_always", f"Always reject {pause.gate}"),
        )
    ]
    try:
        answer = await request(
            "session/request_permission", _permission_params(session_id, tool_call, options, v2)
        )
    except RpcError as exc:
        return Decision.deny(f"the client could not ask: {exc.message}")
    chosen = _chosen(answer)
    if chosen == "allow_once":
        return Decision.approve()
    if chosen == "allow_always":
        return Decision.approve(always=True)
    if chosen in ("reject_once", "reject_always"):
        return Decision.deny("rejected in the editor")
    return Decision.deny("the permission request was cancelled")


def _permission_params(
    session_id: str, tool_call: dict[str, Any], options: list[dict[str, Any]], v2: bool
) -> dict[str, Any]:
    """``session/request_permission``'s params: v1 names the tool call; the v2 draft
    gives the prompt a title of its own and the tool call as its subject."""
    if not v2:
        return {"sessionId": session_id, "toolCall": tool_call, "options": options}
    return {
        "sessionId": session_id,
        "title": tool_call["title"],
        "subject": {"type": "tool_call", "toolCall": tool_call},
        "options": options,
    }


def _chosen(answer: Any) -> Any:
    outcome = answer.get("outcome") if isinstance(answer, Mapping) else None
    return outcome.get("optionId") if isinstance(outcome, Mapping) else None


async def _consent(request: Request, session_id: str, pause: Pause, *, v2: bool) -> Decision:
    """A question for a client without the elicitation mode it needs: an MCP server's
    yes/no form (allow is yes) or a page it asks the user to open (allow is consent) as
    ``session/request_permission``; any other question is declined."""
    field = yes_no_field(pause.schema) if pause.origin is not None else None
    if pause.origin is None or (pause.url is None and field is None):
        return Decision.deny(
            "this ACP client can only allow or reject calls, not answer a question: "
            "ask it in your reply instead"
        )
    title = f"{pause.origin} asks: {pause.question or ''}"
    if pause.url is not None:
        title += f" (open {pause.url})"
    tool_call = {
        "toolCallId": pause.pause_id,
        "title": title[:500],
        "kind": "other",
        "status": "pending",
        "rawInput": {"question": pause.question, "url": pause.url},
    }
    options = [
        {"optionId": "allow_once", "name": "Yes", "kind": "allow_once"},
        {"optionId": "reject_once", "name": "No", "kind": "reject_once"},
    ]
    try:
        answer = await request(
            "session/request_permission", _permission_params(session_id, tool_call, options, v2)
        )
    except RpcError as exc:
        return Decision.deny(f"the client could not ask: {exc.message}")
    chosen = _chosen(answer)
    if chosen == "allow_once":
        return Decision.answer("true" if field is not None else "ok")
    if chosen == "reject_once" and field is not None:
        return Decision.answer("false")
    return Decision.deny("declined in the editor")
