"""What a memory item is, and the checks every item, namespace, key and query passes
before either store sees it.

Both stores (:mod:`cantrip.memory._sqlite`, :mod:`cantrip.memory._postgres`) take their
input only through :func:`prepare_put`, :func:`check_namespace`, :func:`check_key` and
:func:`check_search`, so a bound or a refusal is written once and reads the same on
either database (issue 42.7). Secrets are taken out here too, the way the loom takes
them out of every record it writes (:func:`cantrip._redact.scrub_known` against the
environment's secret values): a memory is as durable as a turn, so it is no more a
credential store than the loom is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cantrip._errors import CantripError
from cantrip._redact import scrub_known, secret_values

Namespace = tuple[str, ...]
"""A namespace: a path of non-empty strings, e.g. ``("user", "alice")``."""

MAX_DEPTH = 8
"""Parts a namespace may have."""
MAX_PART_CHARS = 128
"""Characters of one namespace part."""
MAX_KEY_CHARS = 512
"""Characters of a key."""
MAX_VALUE_BYTES = 256 * 1024
"""UTF-8 bytes of an item's value and metadata, as JSON: a memory is a fact or a note,
not a file (big values belong in the loom's blobs, or elsewhere)."""
MAX_QUERY_CHARS = 1024
"""Characters of a search query."""
MAX_LIMIT = 1000
"""Items one search or namespace listing may return."""

SEPARATOR = "\x1f"
"""Joins a namespace's parts in the tables. A control character, which no part may hold,
so the stored text splits back into exactly its parts and a prefix of parts is a prefix
of the text followed by the separator."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WORD = re.compile(r"\w+")


class MemoryStoreError(CantripError, ValueError):
    """A memory operation was refused: bad input (the bound it broke is named), or a
    store written by a newer cantrip."""


@dataclass(frozen=True, slots=True)
class Item:
    """One stored item, at one revision.

    ``revision`` counts the puts of this key since it was last deleted, from 1;
    ``created_at`` is the time of revision 1, ``updated_at`` that of this revision."""

    namespace: Namespace
    key: str
    value: Any
    metadata: dict[str, Any]
    revision: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SearchItem:
    """An item a search found, with its text-search ``score`` (higher is better; None
    when the search had no query and items are ordered newest first)."""

    item: Item
    score: float | None


@dataclass(frozen=True, slots=True)
class PreparedPut:
    """A put's input, checked and redacted, as both stores write it."""

    namespace: str
    key: str
    value: str
    metadata: str
    text: str
    """What full-text search indexes: the value's strings, in order."""


def check_namespace(namespace: Namespace, *, prefix: bool = False) -> str:
    """``namespace`` as stored (parts joined by :data:`SEPARATOR`), or a
    :class:`MemoryStoreError` saying what is wrong. A ``prefix`` may be empty (every
    namespace); an item's namespace may not."""
    given: object = namespace  # checked: a caller may pass anything
    if isinstance(given, str) or not isinstance(given, tuple | list):
        shown = repr(given)[:200]
        raise MemoryStoreError(
            f"a namespace is a tuple of strings, such as ('user', 'alice'); got {shown}"
        )
    if not namespace and not prefix:
        raise MemoryStoreError("a namespace needs at least one part")
    if len(namespace) > MAX_DEPTH:
        raise MemoryStoreError(
            f"a namespace has at most {MAX_DEPTH} parts (MAX_DEPTH); this one has {len(namespace)}"
        )
    for part in namespace:
        _check_name(part, "namespace part", MAX_PART_CHARS, "MAX_PART_CHARS")
    return SEPARATOR.join(namespace)


def check_key(key: str) -> str:
    """``key``, or a :class:`MemoryStoreError` saying what is wrong with it."""
    _check_name(key, "key", MAX_KEY_CHARS, "MAX_KEY_CHARS")
    return key


def _check_name(name: object, what: str, bound: int, bound_name: str) -> None:
    if not isinstance(name, str):
        raise MemoryStoreError(f"a {what} is a string; got {type(name).__name__}")
    if not name:
        raise MemoryStoreError(f"a {what} may not be empty")
    if len(name) > bound:
        raise MemoryStoreError(
            f"a {what} has at most {bound} characters ({bound_name}); this one has {len(name)}"
        )
    if _CONTROL.search(name):
        raise MemoryStoreError(f"a {what} may not hold NUL or other control characters")
    if not _encodable(name):
        raise MemoryStoreError(f"a {what} must be valid Unicode text (it holds a lone surrogate)")
    if any(secret in name for secret in secret_values()):
        # Redacting it would merge distinct keys into one; refusing loses nothing.
        raise MemoryStoreError(f"a {what} may not hold a secret value from the environment")


def check_revision(revision: int | None) -> None:
    """A revision asked of ``get``: None (the latest) or a positive integer -- ``True``
    or ``"1"`` would otherwise read revision 1 or nothing, silently."""
    if revision is not None and (
        isinstance(revision, bool) or not isinstance(revision, int) or revision < 1
    ):
        raise MemoryStoreError(f"a revision is an integer from 1; got {revision!r}"[:200])


def split_namespace(stored: str) -> Namespace:
    """A namespace as :func:`check_namespace` stored it, as a tuple again."""
    return tuple(stored.split(SEPARATOR))


def prepare_put(
    namespace: Namespace, key: str, value: Any, metadata: dict[str, Any] | None
) -> PreparedPut:
    """A put's input checked, redacted and encoded; the one place both stores take it from."""
    stored_ns = check_namespace(namespace)
    check_key(key)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise MemoryStoreError(f"metadata is a JSON object (a dict); got {type(metadata).__name__}")
    secrets = secret_values()
    value = scrub_known(value, secrets)
    metadata = scrub_known(metadata, secrets)
    value_text = _encode(value, "value")
    metadata_text = _encode(metadata, "metadata")
    size = len(value_text.encode()) + len(metadata_text.encode())
    if size > MAX_VALUE_BYTES:
        raise MemoryStoreError(
            f"an item's value and metadata are at most {MAX_VALUE_BYTES} bytes as JSON "
            f"(MAX_VALUE_BYTES); this one is {size}"
        )
    return PreparedPut(stored_ns, key, value_text, metadata_text, searchable_text(value))


def _encode(value: Any, what: str) -> str:
    """JSON, refusing what is not JSON (a datetime, NaN, a lone surrogate) instead of
    storing a value that would read back as something else."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise MemoryStoreError(f"the {what} is not JSON: {exc}"[:300]) from None
    except RecursionError:
        raise MemoryStoreError(f"the {what} is nested too deeply to store") from None
    if not _encodable(text):
        raise MemoryStoreError(f"the {what} must be valid Unicode text (it holds a lone surrogate)")
    return text


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def searchable_text(value: Any) -> str:
    """The strings inside ``value`` (dict values, list items, the value itself), one a
    line, control characters as spaces: what full-text search indexes. Keys of a dict
    are structure, not content, and are left out."""
    found: list[str] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            found.append(_CONTROL.sub(" ", node))
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return "\n".join(found)


def check_search(query: str | None, limit: int, offset: int) -> list[str] | None:
    """A search's query as its words (None: no query), after checking the bounds."""
    _check_window(limit, offset)
    if query is None:
        return None
    if not isinstance(query, str):
        raise MemoryStoreError(f"a query is a string; got {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise MemoryStoreError(
            f"a query has at most {MAX_QUERY_CHARS} characters (MAX_QUERY_CHARS); "
            f"this one has {len(query)}"
        )
    return _WORD.findall(query)


def _check_window(limit: int, offset: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise MemoryStoreError(
            f"limit is an integer from 1 to {MAX_LIMIT} (MAX_LIMIT); got {limit!r}"
        )
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise MemoryStoreError(f"offset is an integer from 0; got {offset!r}")


def check_listing(max_depth: int | None, limit: int, offset: int) -> None:
    """The bounds of a namespace listing."""
    _check_window(limit, offset)
    if max_depth is not None and (
        isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1
    ):
        raise MemoryStoreError(f"max_depth is an integer from 1; got {max_depth!r}")


def list_namespaces_from(
    stored: list[str], max_depth: int | None, limit: int, offset: int
) -> list[Namespace]:
    """The distinct namespaces among ``stored``, cut to ``max_depth`` parts, in tuple
    order, one page of them. Sorted here, not in SQL: PostgreSQL's collation would
    order the separator differently from SQLite's bytes."""
    found = {split_namespace(text)[:max_depth] for text in stored}
    return sorted(found)[offset : offset + limit]


def under(prefix: str, mark: str) -> tuple[str, list[Any]]:
    """The condition "the item's namespace (``i.namespace``) is ``prefix`` or under it",
    as SQL with ``mark`` for a parameter, and its parameters.

    A range, so the ``(namespace, key)`` index answers it: in code-point order (SQLite's
    BINARY, PostgreSQL's ``COLLATE "C"`` on the column) the namespaces from ``prefix``
    up to ``prefix`` + a space are ``prefix`` itself and those continuing it with
    :data:`SEPARATOR` -- no part may hold a character below a space, so nothing else
    sorts between them, and ``("users",)`` is not under ``("user",)``."""
    if not prefix:
        return "TRUE", []
    return f"(i.namespace >= {mark} AND i.namespace < {mark})", [prefix, prefix + " "]


def decode_json(text: str) -> Any:
    """A value or metadata as :func:`prepare_put` encoded it."""
    return json.loads(text)
