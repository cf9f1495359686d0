"""A cast's pauses asked of the MCP client (``cantrip mcp``): elicitation, both ways.

When a cast served by ``cantrip mcp`` pauses -- a call that needs approval, an
``ask_user`` question, or a question an MCP server of the circle asked (whose
form is passed on as it is) -- and the client declared the elicitation
capability, the client is asked with an elicitation:

* approval: "Approve <gate>(<arguments>)?" with the form ``{approve: boolean,
  reason?: string}``; accept with ``approve`` true approves, false denies with
  the reason;
* question: the question, with the form ``{answer: string}``;
* a server's form: its message and requested schema; the accepted content is
  the answer (checked against that schema like any answer);
* a server's page to open (URL mode): passed on when the client declared URL
  mode; accepted is consent.

``decline`` denies (the entity sees "declined"), ``cancel`` denies with "the
question was dismissed". The decisions are recorded in the loom like any other.
"""

from __future__ import annotations

import json
from typing import Any

from cantrip._approval import Decision, Pause
from cantrip._elicit import checked_content
from cantrip._redact import redact
from cantrip.llm._contract import plain_json

APPROVAL_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve", "description": "Run the call?"},
        "reason": {
            "type": "string",
            "title": "Reason",
            "description": "Why not (shown to the entity when denied)",
        },
    },
    "required": ["approve"],
}
ANSWER_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "title": "Answer"}},
    "required": ["answer"],
}


def can_elicit(capabilities: Any) -> tuple[bool, bool]:
    """Whether a client's declared capabilities take form and URL elicitations (an
    empty ``elicitation`` object means form only, as the spec says)."""
    elicitation = getattr(capabilities, "elicitation", None) if capabilities else None
    if elicitation is None:
        return False, False
    form, url = getattr(elicitation, "form", None), getattr(elicitation, "url", None)
    if form is None and url is None:
        return True, False
    return form is not None, url is not None


def elicitation_params(pause: Pause, *, url_mode: bool) -> Any | None:
    """The ``elicitation/create`` parameters that ask ``pause``; None when the client
    cannot be asked it (a page to open, and the client has no URL mode)."""
    from mcp_types import ElicitRequestFormParams, ElicitRequestURLParams

    if pause.url is not None:
        if not url_mode:
            return None
        return ElicitRequestURLParams(
            message=_message(pause), url=pause.url, elicitation_id=pause.pause_id
        )
    return ElicitRequestFormParams(message=_message(pause), requested_schema=_form(pause))


def _form(pause: Pause) -> dict[str, Any]:
    if pause.schema is not None:
        return dict(pause.schema)
    return APPROVAL_FORM if pause.kind == "approval" else ANSWER_FORM


def _message(pause: Pause) -> str:
    if pause.kind == "approval":
        arguments = json.dumps(plain_json(dict(pause.args)), ensure_ascii=False, default=str)
        if len(arguments) > 2000:
            arguments = arguments[:1997] + "..."
        return redact(f"Approve {pause.gate}({arguments})?")
    if pause.origin is not None:
        return redact(f"{pause.origin} asks (during {pause.gate}): {pause.question or ''}")
    return redact(pause.question or "")


def decision_from(pause: Pause, result: Any) -> Decision:
    """The client's ``ElicitResult`` for ``pause`` as a decision; accepted content that
    does not fill the form asked is :class:`~cantrip._elicit.AnswerError` (checked by
    the linear-time validator: the content is the client's, untrusted)."""
    action = getattr(result, "action", None)
    if action == "decline":
        return Decision.deny("declined by the MCP client")
    if action != "accept":
        return Decision.deny("the MCP client dismissed the question")
    content = checked_content(_form(pause), getattr(result, "content", None) or {})
    if pause.kind == "approval":
        if content.get("approve") is True:
            return Decision.approve()
        reason = content.get("reason")
        return Decision.deny(reason if isinstance(reason, str) and reason else None)
    if pause.url is not None:
        return Decision.answer("ok")
    if pause.schema is not None:
        return Decision.answer(json.dumps(content, ensure_ascii=False))
    answer = content.get("answer")
    return Decision.answer(answer if isinstance(answer, str) else json.dumps(answer))
