"""ACP's JSON-RPC 2.0 framing and the parameters of its requests: the error codes, the
error response, a prompt's text and its busy policy -- what every ACP transport and the
HTTP API's ACP-shaped prompt body (:mod:`cantrip.protocols.asgi._requests`) share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cantrip._text import TextError, check_text

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


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def prompt_text(params: Mapping[str, Any]) -> str:
    """The intent of a prompt, from the variants clients send (PROD-6)."""
    raw = params.get("prompt", params.get("content"))
    if isinstance(raw, str):
        text = raw
    elif isinstance(raw, list):
        parts = []
        for block in raw:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type", "text") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, Mapping) and block.get("type") == "resource":
                resource = block.get("resource") or {}
                if isinstance(resource, Mapping) and "text" in resource:
                    parts.append(str(resource["text"]))
        text = "\n".join(p for p in parts if p)
    elif isinstance(raw, Mapping) and "text" in raw:
        text = str(raw["text"])
    else:
        raise RpcError(INVALID_PARAMS, "the prompt needs text: a string or text content blocks")
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "the prompt is empty")
    try:
        return check_text(text, "the prompt")
    except TextError as exc:
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
