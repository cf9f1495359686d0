"""How every loom record is written and read back: exactly.

One encoder for every writer (the SQLite, JSONL and PostgreSQL stores, the gate
journal) and one decoder for every reader, so nothing the value boundary lets
through (``cantrip._values``: big integers, lone surrogates, deep nesting) is
lost or refused by one path and not another.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from cantrip._redact import scrub_known, secret_values

CODEC_KEY = "codec"
"""Marks a record written by the exact (standard-library) encoder; see :func:`encode_record`."""


def encode_record(record: dict[str, Any]) -> str:
    """A record as every loom store writes it: exact (see :func:`_encode`) and with
    the secret values the environment holds replaced by ``[REDACTED]``.

    PROD-8: the loom is not a credential store. A provider error that quotes the
    key is stored redacted, so an export made later, by a process that does not
    know the key, cannot leak it. Every durable store and the gate journal write
    through here. (Shapes of credentials are redacted on the way out, by exports
    and front ends: a false match there costs a display, here it would cost data.)
    """
    text = _encode(record)
    if holds_secret(text):
        text = _encode(scrub_known(record, secret_values()))
    return text


def holds_secret(text: str) -> bool:
    """Whether encoded ``text`` quotes a secret value the environment holds (then the
    record is written redacted: :func:`encode_record`)."""
    secrets = secret_values()
    return bool(secrets) and any(secret in text for secret in secrets)


def _encode(record: dict[str, Any]) -> str:
    """A record as compact JSON (non-JSON leaves, such as datetimes, as text).

    Serialising is on every append's path (LOOM-1 commits each turn before the
    next begins); orjson does it several times faster than the standard library.
    orjson refuses integers beyond 64 bits, lone surrogates and very deep
    nesting (and reads big integers back as floats); such a record is written
    by the standard library instead -- big integers as digits, lone surrogates
    as ``\\udXXX`` escapes -- and marked ``"codec": "json"`` so that
    :func:`decode_record` reads it back the same way. Nothing is lost (issue 13).
    """
    try:
        return orjson.dumps(record, default=str).decode()
    except TypeError:
        exact = {**record, CODEC_KEY: "json"}
        return json.dumps(exact, default=str, separators=(",", ":"))


def decode_record(data: str | bytes) -> Any:
    """A record written by :func:`encode_record`: orjson for the common case, the standard
    library for records it marked (and for escapes orjson refuses to read)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = json.loads(data)  # lone surrogate escapes; still not JSON => the caller says so
        if isinstance(obj, dict):
            obj.pop(CODEC_KEY, None)
        return obj
    if isinstance(obj, dict) and obj.get(CODEC_KEY) == "json":
        obj = json.loads(data)
        obj.pop(CODEC_KEY, None)
    return obj
