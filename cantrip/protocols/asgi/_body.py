"""Reading an ASGI request body as JSON, bounded: one reader for every HTTP route.

``cantrip serve``'s session routes and the viewer's ``/api/fork`` read bodies the
same way: up to a byte limit (413 beyond it), a client that went away is a 400,
and a body that is not JSON -- malformed, or nested too deeply to parse -- is a 400
``bad_json``, never a 500. Callers turn :class:`BodyError` into their own error
shape. :func:`nests_deeper` measures how deep a parsed value nests, for a protocol
that bounds it (AG-UI's ``RunAgentInput``), without recursing itself.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

Receive = Callable[[], Awaitable[Mapping[str, Any]]]


class BodyError(Exception):
    """A body that cannot be read as JSON: ``status`` and ``code`` say why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


async def read_json_body(receive: Receive, limit: int) -> Any:
    """The request body as JSON; an empty body is ``{}``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyError(400, "bad_request", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyError(413, "too_large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BodyError(400, "bad_json", f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise BodyError(400, "bad_json", "the body is not JSON: nested too deeply") from None


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON: dicts, lists and scalars) nests objects and arrays
    more than ``limit`` levels deep (``{}`` is one level, ``{"a": []}`` two). It walks a
    level at a time with lists of its own instead of recursing -- a check for values too
    deep to recurse on must not recurse -- and stops at the first level past ``limit``:
    O(containers), about half the time parsing them took."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        deeper: list[Any] = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            deeper.extend(c for c in children if isinstance(c, dict | list))
        level = deeper
    return False
