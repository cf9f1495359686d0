"""ACP's JSON-RPC 2.0 framing and the parameters of its requests: the error codes, the
error response, the backend's refusals as errors, a prompt's text and its busy policy --
what every ACP transport shares (a prompt's text is read as every front end reads it,
:mod:`cantrip.protocols.sessions._prompts`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cantrip.protocols.sessions._backend import SessionError
from cantrip.protocols.sessions._prompts import PromptError, read_prompt

PROTOCOL_VERSION = 1
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)
RESOURCE_NOT_FOUND = -32002
"""ACP's code for an unknown session."""
REQUEST_CANCELLED = -32800
"""ACP's code for a request withdrawn by ``$/cancel_request``."""


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_CODES = {
    "not_found": RESOURCE_NOT_FOUND,
    "bad_request": INVALID_PARAMS,
    "cast_failed": INTERNAL,
    "crashed": INTERNAL,
}
"""JSON-RPC codes for the backend's refusals (any other kind: the request's fault)."""


def rpc_error(exc: SessionError) -> RpcError:
    return RpcError(_CODES.get(exc.kind, INVALID_REQUEST), exc.message)


def prompt_text(params: Mapping[str, Any]) -> str:
    """The intent of a prompt, from the variants clients send (PROD-6); a prompt
    without usable text is ACP's ``INVALID_PARAMS``."""
    try:
        return read_prompt(params)
    except PromptError as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None


def error_response(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


ACP_ON_BUSY = ("enqueue", "steer", "interrupt", "rollback", "reject")


def on_busy(params: Mapping[str, Any]) -> str:
    """A ``session/prompt``'s double-texting policy: ``_meta.cantrip.onBusy``."""
    meta = params.get("_meta")
    cantrip_meta = meta.get("cantrip") if isinstance(meta, Mapping) else None
    policy = cantrip_meta.get("onBusy") if isinstance(cantrip_meta, Mapping) else None
    if policy is None:
        return "enqueue"
    if policy not in ACP_ON_BUSY:
        raise RpcError(
            INVALID_PARAMS, f"_meta.cantrip.onBusy must be one of {', '.join(ACP_ON_BUSY)}"
        )
    return str(policy)
