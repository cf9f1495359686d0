"""An A2A message's parts as text: what a cantrip entity reads of them, on both sides
(the gate reading a remote agent's reply, the server reading a client's prompt)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def parts_text(parts: Iterable[Any]) -> str:
    """Parts as text, one per line: text as is, data as JSON, a URL as itself, an
    inline file by its type, name and size (its bytes are not text)."""
    from google.protobuf.json_format import MessageToDict

    out: list[str] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            out.append(part.text)
        elif kind == "data":
            out.append(json.dumps(MessageToDict(part.data)))
        elif kind == "url":
            out.append(part.url)
        elif kind == "raw":
            out.append(f"[{part.media_type or 'file'} {part.filename}: {len(part.raw)} bytes]")
    return "\n".join(piece for piece in out if piece)
