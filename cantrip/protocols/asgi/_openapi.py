"""The HTTP API's contract as an OpenAPI 3.1 document, built from its models
(:mod:`._api_models`; issue 20).

The same :class:`~._api_models.PromptRequest` validates every prompt body the server
accepts and describes it in ``/openapi.json``, so the published contract cannot drift
from what is enforced. Response models describe what the handlers send (the
schemathesis run in the test suite checks every live response against them).
"""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import BaseModel

from cantrip.protocols.asgi._api_models import (
    ON_BUSY,
    Answered,
    AnswerRequest,
    Cancelled,
    CancelRequest,
    CreateSession,
    Deleted,
    ErrorBody,
    Health,
    PendingBody,
    PromptRequest,
    PromptResult,
    SessionInfo,
    SessionList,
    Steered,
    SteerRequest,
    ThreadBody,
)
from cantrip.protocols.asgi._openapi_memory import MODELS as memory_models
from cantrip.protocols.asgi._openapi_memory import memory_paths
from cantrip.protocols.sessions import _steering as steering

_ERRORS = {
    "400": "Malformed JSON, a wrong content type, or a body that does not match the schema",
    "401": "A token is required (``Authorization: Bearer ...``) and was missing or wrong",
    "403": "The Host or Origin header is not allowed (DNS rebinding, cross-site requests)",
    "408": "The body did not arrive in time",
    "413": "The body is larger than the server's limit",
}


def _json_content(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}


def _responses(ok: dict[str, tuple[str, str]], *errors: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        status: {"description": text, "content": _json_content(model)}
        for status, (model, text) in ok.items()
    }
    for status in (*_ERRORS, *errors):
        text = _ERRORS.get(status) or _EXTRA_ERRORS[status]
        out[status] = {"description": text, "content": _json_content("ErrorBody")}
    return out


_EXTRA_ERRORS = {
    "404": "No such session (nor one in the loom to resume); memory: no such item, or "
    "no memory (no_memory)",
    "414": "The query string is longer than the route reads",
    "405": "The route exists; the method does not",
    "409": "The session is already running a prompt, or the pause was already answered, "
    "or (messages) no prompt is running to take the message, or (create) the "
    "Idempotency-Key names a session created for another user, or (memory) a semantic "
    "or hybrid search where no embedder is configured, or (delete) a prompt of the "
    "session is open (busy) or a fork stands on it (cannot_delete)",
    "500": "The cast failed (the LLM failed for good) or the entity crashed",
    "501": "(delete) The server's loom cannot delete sessions (in memory, JSONL)",
    "422": "The Idempotency-Key was already used for a different prompt",
    "429": f"The running prompt has taken all the steering one cast takes "
    f"({steering.MAX_MESSAGES} messages, {steering.MAX_BYTES // 1024} KiB in all; see "
    "Retry-After); send the message as a prompt once it ends",
    "503": "The live-session cap is reached and every session is busy, too many prompts "
    "are running, the server is shutting down, or (serve --db) its database is unreachable "
    "(see Retry-After)",
}

_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A repeat with the same key returns the recorded result (or joins the "
    "running cast) instead of running again; recorded in the loom, so it survives a restart",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
}

_SESSION_ID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$", "maxLength": 100},
}


def openapi_document(title: str = "cantrip serve") -> dict[str, Any]:
    """The OpenAPI 3.1 description of ``cantrip serve`` (served at ``/openapi.json``):
    one document for both servers (``serve --db`` answers every route the same way)."""
    models: list[type[BaseModel]] = [
        PromptRequest,
        CreateSession,
        ErrorBody,
        Health,
        SessionInfo,
        SessionList,
        ThreadBody,
        PromptResult,
        Cancelled,
        CancelRequest,
        AnswerRequest,
        PendingBody,
        Answered,
        SteerRequest,
        Steered,
        Deleted,
        *memory_models,
    ]
    _, schemas = pydantic.json_schema.models_json_schema(
        [
            (
                m,
                "validation"
                if m in (PromptRequest, CreateSession, AnswerRequest, SteerRequest, CancelRequest)
                else "serialization",
            )
            for m in models
        ],
        ref_template="#/components/schemas/{model}",
    )
    components = schemas.get("$defs", {})
    session = [_SESSION_ID]
    found = ("404", "405", "503")
    sse = {
        "text/event-stream": {
            "schema": {
                "description": "One server-sent event: `event` names it (prompt, with the "
                "prompt_id, first; step_start, text_delta, tool_call, ..., then result or "
                "error); `data` is its JSON",
                "type": "object",
                "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
            }
        }
    }
    prompt_ok = _responses(
        {"200": ("PromptResult", "The cast's outcome")}, "404", "405", "409", "422", "500"
    )
    prompt_ok["200"]["content"].update(sse)
    prompt_ok["200"]["headers"] = {
        "Prompt-Id": {
            "description": "The prompt's id, for a cancel that names it; a stream also "
            "sends it at once, as its first event (prompt)",
            "schema": {"type": "string"},
        }
    }
    paths: dict[str, Any] = {
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness, and what the cantrip is",
                "responses": _responses({"200": ("Health", "The server is up")}, "405", "503"),
            }
        },
        "/sessions": {
            "get": {
                "operationId": "listSessions",
                "summary": "The live sessions",
                "responses": _responses({"200": ("SessionList", "Live sessions")}, "405", "503"),
            },
            "post": {
                "operationId": "createSession",
                "summary": "Summon an entity",
                "parameters": [_IDEMPOTENCY_KEY],
                "requestBody": {"required": False, "content": _json_content("CreateSession")},
                "responses": {
                    **_responses({"201": ("SessionInfo", "The new session")}, "405", "409", "503"),
                    "201": {
                        "description": "The new session (with a repeated Idempotency-Key: "
                        "the session that key created, and the header Idempotent-Replayed)",
                        "content": _json_content("SessionInfo"),
                        "links": {
                            "prompt": {
                                "operationId": "prompt",
                                "parameters": {"session_id": "$response.body#/session_id"},
                            },
                            "getSession": {
                                "operationId": "getSession",
                                "parameters": {"session_id": "$response.body#/session_id"},
                            },
                            "thread": {
                                "operationId": "thread",
                                "parameters": {"session_id": "$response.body#/session_id"},
                            },
                            "cancel": {
                                "operationId": "cancel",
                                "parameters": {"session_id": "$response.body#/session_id"},
                            },
                        },
                    },
                },
            },
        },
        "/sessions/{session_id}": {
            "get": {
                "operationId": "getSession",
                "summary": "One session (a session in the loom file is resumed)",
                "parameters": session,
                "responses": _responses({"200": ("SessionInfo", "The session")}, *found),
            },
            "delete": {
                "operationId": "deleteSession",
                "summary": "Remove the session's whole tree from the loom (the retention "
                "rule); refused while a prompt of it is open",
                "parameters": session,
                "responses": _responses(
                    {"200": ("Deleted", "The session is gone")}, *found, "409", "501"
                ),
            },
        },
        "/sessions/{session_id}/prompt": {
            "post": {
                "operationId": "prompt",
                "summary": "One cast; with Accept: text/event-stream or ?stream=1, its events",
                "parameters": [
                    *session,
                    {
                        "name": "stream",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
                    },
                    {
                        "name": "cancel_on_disconnect",
                        "in": "query",
                        "required": False,
                        "description": "Streamed prompts: cancel the cast if the client hangs up",
                        "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
                    },
                    {
                        "name": "on_busy",
                        "in": "query",
                        "required": False,
                        "description": "When a prompt is already running: reject (409), enqueue "
                        "(run after it), interrupt (cancel it, then run with both in the "
                        "history) or rollback (cancel it, then run from before it; its turns "
                        "stay in the loom as a branch). Default: the server's --on-busy",
                        "schema": {
                            "type": "string",
                            "enum": list(ON_BUSY),
                        },
                    },
                    _IDEMPOTENCY_KEY,
                ],
                "requestBody": {"required": True, "content": _json_content("PromptRequest")},
                "responses": {**prompt_ok, "503": _responses({}, "503")["503"]},
            }
        },
        "/sessions/{session_id}/messages": {
            "post": {
                "operationId": "steer",
                "summary": "Send a message to the running prompt: it joins the cast's next "
                "turn and is recorded there",
                "parameters": session,
                "requestBody": {"required": True, "content": _json_content("SteerRequest")},
                "responses": _responses(
                    {"202": ("Steered", "Accepted for the next turn")}, *found, "409", "429"
                ),
            }
        },
        "/sessions/{session_id}/cancel": {
            "post": {
                "operationId": "cancel",
                "summary": "Cancel a prompt (recorded as cancelled): the running one, or the "
                "one named by its Prompt-Id or Idempotency-Key; with next, the next to start",
                "parameters": session,
                "requestBody": {"required": False, "content": _json_content("CancelRequest")},
                "responses": _responses(
                    {"200": ("Cancelled", "What was cancelled (or armed, or nothing)")},
                    "404",
                    "405",
                    "503",
                ),
            }
        },
        "/sessions/{session_id}/pending": {
            "get": {
                "operationId": "pending",
                "summary": "Calls waiting for a human (approvals, ask_user questions)",
                "parameters": session,
                "responses": _responses({"200": ("PendingBody", "The pending pauses")}, *found),
            }
        },
        "/sessions/{session_id}/pending/{pause_id}": {
            "post": {
                "operationId": "answerPause",
                "summary": "Answer a pause: the paused turn goes on (approve runs the gate "
                "once; deny gives the model an error observation)",
                "parameters": [
                    *session,
                    {
                        "name": "pause_id",
                        "in": "path",
                        "required": True,
                        "schema": {
                            "type": "string",
                            "pattern": "^[A-Za-z0-9_-]+$",
                            "maxLength": 100,
                        },
                    },
                ],
                "requestBody": {"required": True, "content": _json_content("AnswerRequest")},
                "responses": {
                    **_responses(
                        {
                            "200": ("PromptResult", "The continued cast's outcome"),
                            "202": ("Answered", "A running prompt waited on it and goes on"),
                        },
                        "404",
                        "405",
                        "409",
                        "500",
                        "503",
                    ),
                },
            }
        },
        "/sessions/{session_id}/thread": {
            "get": {
                "operationId": "thread",
                "summary": "The session's turns, root first",
                "parameters": session,
                "responses": _responses({"200": ("ThreadBody", "The thread")}, *found),
            }
        },
        **memory_paths(_responses),
        "/sessions/{session_id}/events": {
            "get": {
                "operationId": "events",
                "summary": "Server-sent events of every prompt of the session from now on",
                "parameters": session,
                "responses": {
                    **_responses({}, "404", "405", "503"),
                    "200": {"description": "An endless event stream", "content": sse},
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": "1",
            "description": "The HTTP session API of a cantrip (documentation: ACP and HTTP).",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
