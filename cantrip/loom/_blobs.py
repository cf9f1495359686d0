"""Big values stored once: content-addressed blobs that turns refer to.

An agent that reads the same large file or tool result again and again would make
its loom grow by that value every time. On disk (SQLite, JSONL, PostgreSQL; the memory
store keeps objects), a turn's text fields, gate results and extras (what a medium
showed) of ``THRESHOLD`` characters or more are stored once and the turn holds a
reference ``{"$blob": KEY, "size": N, "kind": "text" | "json"}``. Reading a turn
resolves its references, so nothing above the store ever sees one: threads, exports,
the viewer and replay read whole values.

The key is the SHA-256 of the kind, a newline and the value's text (a string itself,
a structured value its JSON): a string whose text is some dict's JSON is another
blob than the dict, and reads back as that string. Reading checks that the blob
still hashes to its key; one that does not is damage (a :class:`BlobDamaged`
naming ``check`` and ``recover``), never served as the value.

References written before the kind was in the key (no ``"kind"``; ``"json": true``
for a structured value) keep working: their key is the SHA-256 of the text alone,
checked the same way, and as a string and a dict of the same text then shared a
blob, the value is read back as the kind the reference names.

The value is redacted (the environment's secret values) before it is hashed, as the
codec would redact it when stored, so a secret inside a big value is no more stored
than one inside a small one and the key is of what is stored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from cantrip._errors import LoomError
from cantrip._redact import scrub_known, secret_values
from cantrip.loom._codec import decode_record, encode_record

THRESHOLD = 16 * 1024
"""Characters from which a value is stored as a blob (small values stay inline: a
reference and a lookup would cost more than they save)."""

REF = "$blob"
KIND = "kind"
TEXT, JSON = "text", "json"

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
        text = _text(value)
        if text is None or len(text) < THRESHOLD:
            return value
        secrets = secret_values()  # only for a big value: most turns hold none
        if secrets and any(secret in text for secret in secrets):
            value = scrub_known(value, secrets)  # what the codec would store
            text = _text(value) or ""
        kind = TEXT if isinstance(value, str) else JSON
        digest = key(kind, text)
        blobs.setdefault(digest, value)
        return {REF: digest, "size": len(text), KIND: kind}

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


def key(kind: str | None, text: str) -> str:
    """A blob's key: the SHA-256 of its kind and text (``kind`` None: a reference
    written before the kind was in the key -- the text alone)."""
    data = text.encode("utf-8", "surrogatepass")
    if kind is not None:
        data = kind.encode() + b"\n" + data
    return hashlib.sha256(data).hexdigest()


def _text(value: Any) -> str | None:
    """A value's text (a string's own, a structured value's JSON); None for others."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return _json_text(value)
    return None


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


class BlobDamaged(LoomError):
    """A blob that no longer hashes to its key: the loom is damaged."""


def intact(digest: str, stored: Any) -> bool:
    """Whether a blob's content hashes to its key, as any reference may name it
    (``check`` looks at blobs without their references)."""
    text = _text(stored)
    if text is None:
        return False
    kind = TEXT if isinstance(stored, str) else JSON
    return digest in (key(kind, text), key(None, text))


def resolve(ref: Mapping[str, Any], stored: Any) -> Any:
    """The value ``ref`` stands for, from the blob stored under its key; a
    :class:`BlobDamaged` when the blob does not hash to that key."""
    digest = str(ref[REF])
    text = _text(stored)
    kind = ref.get(KIND)
    if kind is not None:
        held = TEXT if isinstance(stored, str) else JSON
        if text is None or held != kind or key(kind, text) != digest:
            raise BlobDamaged(f"blob {digest} does not match its key")
        return stored
    # written before the kind was in the key: the text's hash alone
    if text is None or key(None, text) != digest:
        raise BlobDamaged(f"blob {digest} does not match its key")
    if not ref.get("json"):
        return text  # a string (its shared blob may hold the dict of the same text)
    if not isinstance(stored, str):
        return stored
    try:
        return orjson.loads(stored)
    except orjson.JSONDecodeError:  # what orjson refuses (big integers): as it was written
        return json.loads(stored)


def encode_blob(value: Any) -> str:
    """How a blob's value is stored in a table (the records' codec)."""
    return encode_record({"data": value})


def decode_blob(stored: str | bytes) -> Any:
    return decode_record(stored)["data"]


def internalize(
    turn: dict[str, Any],
    fetch: Callable[[str], Any],
    *,
    where: str = "the loom",
    damaged: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """``turn`` with every reference replaced by its value (``fetch``: hash -> the value,
    or ``MISSING``). A missing blob, or one that does not hash to its key, is a
    :class:`~cantrip.LoomError` naming ``where`` (the loom) and the commands that look
    at the damage -- or, with ``damaged`` (salvage), what it returns for the key."""

    def value(item: Any) -> Any:
        if not is_ref(item):
            return item
        stored = fetch(item[REF])
        if stored is MISSING:
            raise LoomError(
                f"turn {turn.get('id')} refers to blob {item[REF]} that the loom does not hold"
            )
        try:
            return resolve(item, stored)
        except BlobDamaged as exc:
            if damaged is not None:
                return damaged(str(item[REF]))
            raise BlobDamaged(
                f"{where}: turn {turn.get('id')}: {exc}: the loom is damaged. Run "
                f"'cantrip loom {where} check' to see what is readable and 'cantrip loom "
                f"{where} recover NEW.db' to copy its readable turns into a new file"
            ) from None

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
