"""The memory routes' part of ``/openapi.json`` (:mod:`cantrip.protocols.http._memory`).

Kept beside :mod:`._openapi` (which merges it in) so the session API's contract and the
memory routes' can change apart. Response models describe what
:mod:`cantrip.memory._browse` returns; the schemathesis run checks live answers
against them like the rest.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from cantrip.memory._browse import MAX_NAMESPACE_TEXT, MODES
from cantrip.memory._model import (
    MAX_DEPTH,
    MAX_KEY_CHARS,
    MAX_LIMIT,
    MAX_PART_CHARS,
    MAX_QUERY_CHARS,
)


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryNamespaces(_Out):
    namespaces: list[str]
    """Each namespace as its parts joined by ``/``."""


class MemorySource(_Out):
    turn_id: str
    entity_id: str


class MemoryTurn(_Out):
    turn_id: str
    entity_id: str
    sequence: int
    intent: str | None
    utterance: str | None


class MemoryItem(_Out):
    namespace: list[str]
    key: str
    value: Any
    revision: int
    updated_at: str
    source: MemorySource | None
    score: float | None
    """The search's score (None: listed newest first, without a query)."""


class MemoryItems(_Out):
    items: list[MemoryItem]


class MemoryRevision(_Out):
    namespace: list[str]
    key: str
    value: Any
    revision: int
    updated_at: str
    created_at: str
    source: MemorySource | None


class MemoryItemShown(_Out):
    namespace: list[str]
    key: str
    value: Any
    revision: int
    updated_at: str
    created_at: str
    source: MemorySource | None
    metadata: dict[str, Any]
    source_turn: MemoryTurn | None
    """The turn that wrote it (None: written by code, or no longer in the loom)."""
    revisions: list[MemoryRevision]
    """Newest first, at most 100."""


class MemoryForgotten(_Out):
    dry_run: bool
    forgotten: list[dict[str, str]]
    """``{"namespace": "a/b", "key": ...}`` of each item forgotten (or that would be)."""


MODELS: list[type[BaseModel]] = [
    MemoryNamespaces,
    MemoryItems,
    MemoryItemShown,
    MemoryForgotten,
]


def _param(name: str, schema: dict[str, Any], text: str, *, required: bool = False) -> Any:
    return {"name": name, "in": "query", "required": required, "schema": schema,
            "description": text}  # fmt: skip


_CHAR = r"[^\x00-\x1f\x7f/]"
_PART = _CHAR + "{1," + str(MAX_PART_CHARS) + "}"
_FIRST = r"[^\x00-\x1f\x7f/\[]" + _CHAR + "{0," + str(MAX_PART_CHARS - 1) + "}"
_PARTS = "^" + _FIRST + "(/" + _PART + "){0," + str(MAX_DEPTH - 1) + "}$"
"""Parts joined by '/' (the JSON-list form is accepted too, not described here)."""
_NAMESPACE = {"type": "string", "maxLength": MAX_NAMESPACE_TEXT, "pattern": "^$|" + _PARTS}
_ITEM_NAMESPACE = {"type": "string", "maxLength": MAX_NAMESPACE_TEXT, "pattern": _PARTS}
"""An item's namespace, or what forget takes: not empty."""
_KEY = {"type": "string", "pattern": r"^[^\x00-\x1f\x7f]{1," + str(MAX_KEY_CHARS) + "}$"}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}


def memory_paths(responses: Any) -> dict[str, Any]:
    """The ``/memory/...`` paths; ``responses(ok, *errors)`` is the document's own
    response builder (its error texts)."""
    errors = ("400", "404", "405", "414")
    namespace = "Parts joined by '/' (user/alice), or a JSON list of strings"
    return {
        "/memory/namespaces": {
            "get": {
                "operationId": "memoryNamespaces",
                "summary": "The memory namespaces holding items (404 no_memory: no [memory])",
                "parameters": [
                    _param("prefix", _NAMESPACE, "Only under this namespace. " + namespace),
                    _param("limit", _LIMIT, "At most this many (default 100)"),
                ],
                "responses": responses({"200": ("MemoryNamespaces", "The namespaces")}, *errors),
            }
        },
        "/memory/items": {
            "get": {
                "operationId": "memoryItems",
                "summary": "Items under a namespace: best match first with q, newest first without",
                "parameters": [
                    _param("namespace", _NAMESPACE, "Only under this namespace. " + namespace),
                    _param("q", {"type": "string", "maxLength": MAX_QUERY_CHARS}, "The query"),
                    _param(
                        "mode",
                        {"type": "string", "enum": list(MODES)},
                        "text, semantic or hybrid (the latter two need an embedder)",
                    ),
                    _param("limit", _LIMIT, "At most this many (default 20)"),
                    _param(
                        "offset",
                        {"type": "integer", "minimum": 0, "maximum": 999_999_999},
                        "Skip this many",
                    ),
                ],
                "responses": responses({"200": ("MemoryItems", "The items")}, *errors, "409"),
            },
            "delete": {
                "operationId": "memoryForget",
                "summary": "Forget one item (key) or every item under a namespace (not an "
                "empty one), every revision of each; dry_run only says which",
                "parameters": [
                    _param("namespace", _ITEM_NAMESPACE, namespace, required=True),
                    _param("key", _KEY, "Only this item"),
                    _param(
                        "dry_run",
                        {"type": "string", "enum": ["0", "1", "true", "false"]},
                        "Say what would be forgotten; forget nothing",
                    ),
                ],
                "responses": responses(
                    {"200": ("MemoryForgotten", "What was (or would be) forgotten")}, *errors
                ),
            },
        },
        "/memory/item": {
            "get": {
                "operationId": "memoryItem",
                "summary": "One item, its revisions and the turn that wrote it",
                "parameters": [
                    _param("namespace", _ITEM_NAMESPACE, namespace, required=True),
                    _param("key", _KEY, "The item's key", required=True),
                ],
                "responses": responses({"200": ("MemoryItemShown", "The item")}, *errors),
            }
        },
    }
