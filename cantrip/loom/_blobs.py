"""Big values stored once: content-addressed blobs that turns refer to.

An agent that reads the same large file or tool result again and again would make
its loom grow by that value every time. On disk (SQLite, JSONL, PostgreSQL; the memory
store keeps objects), a turn's text fields, gate results and extras (what a medium
showed) of ``THRESHOLD`` characters or more are stored once, under the SHA-256 of
their content, and the turn holds a reference ``{"$blob": HASH, "size": N}``
(``"json": true`` for a structured value stored as its JSON text). Reading a turn
resolves its references, so nothing above the store ever sees one: threads, exports,
the viewer and replay read whole values.

The blob's text goes through the same codec as every record (exact, and with the
environment's secret values redacted), so a secret inside a big value is no more
stored than one inside a small one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from cantrip.loom._codec import decode_record, encode_record

THRESHOLD = 16 * 1024
"""Characters from which a value is stored as a blob (small values stay inline: a
reference and a lookup would cost more than they save)."""

REF = "$blob"

Blob = tuple[str, Any]
"""(hash, the value)."""

_TEXT_FIELDS = ("observation", "content", "result")

MISSING: Any = object()
"""What a fetch returns for a hash the store does not hold."""


def externalize(turn: dict[str, Any]) -> tuple[dict[str, Any], list[Blob]]:
    """``turn`` (a turn's plain record) with its big values replaced by references, and
    the blobs to store (each at most once per turn)."""
    blobs: dict[str, Any] = {}

    def ref(value: Any) -> Any:
        if isinstance(value, str):
            if len(value) < THRESHOLD:
                return value
            text, structured = value, False
        elif isinstance(value, dict | list):
            text = _json_text(value)
            if len(text) < THRESHOLD:
                return value
            structured = True
        else:
            return value
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        blobs.setdefault(digest, value)
        out: dict[str, Any] = {REF: digest, "size": len(text)}
        if structured:
            out["json"] = True
        return out

    out = dict(turn)
    for field in _TEXT_FIELDS:
        if field in out:
            out[field] = ref(out[field])
    calls = out.get("gate_calls")
    if calls:
        out["gate_calls"] = [{**call, "result": ref(call.get("result"))} for call in calls]
    extras = out.get("extras")
    if extras:  # what a medium showed (console output, the capped observation text)
        out["extras"] = {key: ref(value) for key, value in extras.items()}
    return out, list(blobs.items())


def _json_text(value: Any) -> str:
    """A structured value's JSON text, for its size and its hash: orjson, or the
    standard library for what orjson refuses (big integers, lone surrogates: the same
    fallback as the records' codec)."""
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        return json.dumps(value, default=str, separators=(",", ":"))


def is_ref(value: Any) -> bool:
    return isinstance(value, Mapping) and REF in value and len(value) <= 3


def encode_blob(value: Any) -> str:
    """How a blob's value is stored in a table (the records' codec)."""
    return encode_record({"data": value})


def decode_blob(stored: str | bytes) -> Any:
    return decode_record(stored)["data"]


def internalize(turn: dict[str, Any], fetch: Callable[[str], Any]) -> dict[str, Any]:
    """``turn`` with every reference replaced by its value (``fetch``: hash -> the value,
    or ``_MISSING``). A missing blob is a :class:`~cantrip.LoomError`: the loom is damaged."""

    def value(item: Any) -> Any:
        if not is_ref(item):
            return item
        stored = fetch(item[REF])
        if stored is MISSING:
            from cantrip._errors import LoomError

            raise LoomError(
                f"turn {turn.get('id')} refers to blob {item[REF]} that the loom does not hold"
            )
        return stored

    for field in _TEXT_FIELDS:
        if field in turn:
            turn[field] = value(turn[field])
    calls = turn.get("gate_calls")
    if calls:
        for call in calls:
            if "result" in call:
                call["result"] = value(call["result"])
    extras = turn.get("extras")
    if extras:
        for key in list(extras):
            extras[key] = value(extras[key])
    return turn


def has_refs(data: str | bytes) -> bool:
    """Whether a stored turn may hold references (a cheap test before decoding them)."""
    if isinstance(data, bytes):
        return b'"$blob"' in data
    return '"$blob"' in data
