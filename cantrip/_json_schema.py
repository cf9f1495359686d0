"""A JSON Schema that checks untrusted answers without stalling the runtime (issue 28).

An output schema is the spec author's; the answer it checks is the model's, and
the model may be steered by anything it read. Checking runs on the event loop
(the ``done`` gate), so nothing the answer holds may make it slow:

* **Patterns** (``pattern``, ``patternProperties``) are matched by a linear-time
  engine: validation is compiled by ``jsonschema-rs`` with the Rust ``regex``
  crate (``RegexOptions``), which has no backtracking. ``^(a+)+$`` against
  ``a...a!`` is a plain mismatch, not hours of the loop. A pattern that engine
  cannot compile (look-around, back-references) is refused when the schema
  loads, with the pattern named.
* **References** are never retrieved: the retriever refuses every URI, so a
  ``$ref`` to a remote URL or a file is a load-time error instead of a request
  per answer. References inside the schema (``#/$defs/...``) resolve as usual.
* **Reference cycles** that never reach a value (``{"$ref": "#"}``, ``a -> b ->
  a`` through ``allOf``/``anyOf``/...) are refused at load. Recursion through
  ``properties``/``items`` (a tree) is fine: each step goes one level into the
  answer.
* **Depth**: the native validator recurses with the answer, so it must never see
  a deeply nested one. It does not: every answer crosses the value boundary
  (:mod:`cantrip._values`) first, which refuses more than ``MAX_VALUE_DEPTH``
  (100) levels.

The schema itself is first checked against its meta-schema (:func:`check_meta_schema`,
jsonschema-rs's ``meta``, with the same refusal to retrieve anything): the message
names what is wrong and where.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

import jsonschema_rs

from cantrip._errors import ConstructionError

_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP = ("dependentSchemas", "dependencies")
"""Keywords whose subschemas apply to the same value: a ``$ref`` cycle through only
these never moves into the answer, so it never ends."""
_DEEPER_ONE = (
    "items",
    "additionalItems",
    "contains",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_DEEPER_MANY = ("prefixItems", "items")
_DEEPER_MAP = ("properties", "patternProperties", "$defs", "definitions")
"""(``$defs``/``definitions`` apply to nothing by themselves: walked only to be named.)"""
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")


class _NoRetrieval(Exception):
    """Raised by the retriever for every URI: nothing is ever fetched."""


def _refuse(uri: str) -> Any:
    raise _NoRetrieval(uri)


_NO_RETRIEVAL = jsonschema_rs.Registry([], retriever=_refuse)


def check_meta_schema(schema: Mapping[str, Any]) -> None:
    """:class:`ConstructionError` unless ``schema`` is a valid JSON Schema of the draft
    its ``$schema`` names (the latest without one). A ``$schema`` that is not a draft
    jsonschema-rs knows is refused by :func:`compile_schema`, never fetched."""
    try:
        jsonschema_rs.meta.validate(dict(schema), registry=_NO_RETRIEVAL)
    except jsonschema_rs.ValidationError as exc:
        where = "/".join(map(str, exc.instance_path))
        at = f" (at {where})" if where else ""
        message = f"output schema is not a valid JSON Schema: {exc.message}{at}"
        raise ConstructionError(message) from None
    except jsonschema_rs.ReferencingError:
        pass  # an unknown $schema: compile_schema says so, with the URI


def compile_schema(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """A validator for ``schema``, or :class:`ConstructionError` naming the problem."""
    refuse_cycles(schema)
    try:
        return jsonschema_rs.validator_for(
            dict(schema),
            validate_formats=False,  # formats are annotations, as in the jsonschema library
            retriever=_refuse,
            pattern_options=jsonschema_rs.RegexOptions(),
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        raise ConstructionError(f"output schema cannot be used: {_compile_problem(exc)}") from None


def _compile_problem(exc: Exception) -> str:
    text = str(exc)
    first = text.split("\n", 1)[0].strip()
    if "is not present in a registry" in text:
        uri = first.split("'")[1] if first.count("'") >= 2 else first
        return (
            f"$ref {uri!r} points outside the schema; cantrip never retrieves a reference "
            "(remote URLs and files are refused)"
        )
    if first.endswith('is not a "regex"'):
        return (
            f"{first} (patterns are matched in linear time, so look-around and "
            "back-references are not supported)"
        )
    return first


# -- reference cycles -------------------------------------------------------------


def refuse_cycles(schema: Mapping[str, Any]) -> None:
    """:class:`ConstructionError` if a ``$ref`` chain comes back to where it started
    without going into the answer (only local ``#...`` references are followed;
    anything else is refused by the retriever when the schema compiles)."""
    graph = _Graph(schema)
    cycle = graph.find_cycle()
    if cycle is not None:
        raise ConstructionError(
            f"output schema cannot be used: $ref cycle {' -> '.join(cycle)} never reaches "
            "a value to check (a reference may recur only inside properties or items)"
        )


class _Graph:
    """Subschemas of one document, and which apply to the same value as which."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.names: dict[int, str] = {}
        """Subschema (by identity) -> the pointer it is first found at."""
        self.same_value: dict[int, list[tuple[Mapping[str, Any], str | None]]] = {}
        """Subschema -> subschemas that check the same value (with the $ref that led there)."""
        self._nodes: dict[int, Mapping[str, Any]] = {}
        self._walk()

    def _walk(self) -> None:
        pending: list[tuple[Mapping[str, Any], str, Mapping[str, Any]]] = [
            (self.root, "#", self.root)
        ]
        while pending:
            node, pointer, base = pending.pop()
            if id(node) in self._nodes:
                continue
            self._nodes[id(node)] = node
            self.names[id(node)] = pointer
            if isinstance(node.get("$id"), str) and node is not self.root:
                base = node  # a resource of its own: "#..." inside it is relative to it
            edges = self.same_value.setdefault(id(node), [])
            for child, where, in_place in _subschemas(node, pointer):
                pending.append((child, where, base))
                if in_place:
                    edges.append((child, None))
            for keyword in _REFS:
                ref = node.get(keyword)
                if isinstance(ref, str) and ref.startswith("#"):
                    target = _local(base, ref)
                    if target is not None:
                        pending.append((target, ref, base))
                        edges.append((target, ref))

    def find_cycle(self) -> list[str] | None:
        """One cycle through same-value edges as the pointer it starts at and the
        ``$ref`` values followed, or None (an iterative depth-first search)."""
        done: set[int] = set()
        for start in list(self._nodes):
            if start in done:
                continue
            path: list[tuple[int, str | None]] = [(start, None)]
            on_path = {start}
            stack = [iter(self.same_value.get(start, ()))]
            while stack:
                step = next(stack[-1], None)
                if step is None:
                    key, _ = path.pop()
                    on_path.discard(key)
                    done.add(key)
                    stack.pop()
                    continue
                child, ref = step
                key = id(child)
                if key in on_path:
                    begin = next(i for i, (k, _) in enumerate(path) if k == key)
                    refs = [r for _, r in path[begin + 1 :] if r is not None]
                    return [self.names[key], *refs, *([ref] if ref is not None else [])]
                if key not in done:
                    path.append((key, ref))
                    on_path.add(key)
                    stack.append(iter(self.same_value.get(key, ())))
        return None


def _subschemas(
    node: Mapping[str, Any], pointer: str
) -> Iterator[tuple[Mapping[str, Any], str, bool]]:
    """(subschema, its pointer, whether it checks the same value as ``node``)."""
    for keyword in (*_IN_PLACE_ONE, *_DEEPER_ONE):
        child = node.get(keyword)
        if isinstance(child, Mapping):
            yield child, f"{pointer}/{keyword}", keyword in _IN_PLACE_ONE
    for keyword in (*_IN_PLACE_MANY, *_DEEPER_MANY):
        children = node.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                if isinstance(child, Mapping):
                    yield child, f"{pointer}/{keyword}/{index}", keyword in _IN_PLACE_MANY
    for keyword in (*_IN_PLACE_MAP, *_DEEPER_MAP):
        children = node.get(keyword)
        if isinstance(children, Mapping):
            for name, child in children.items():
                if isinstance(child, Mapping):
                    where = f"{pointer}/{keyword}/{_escape(str(name))}"
                    yield child, where, keyword in _IN_PLACE_MAP


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _local(base: Mapping[str, Any], ref: str) -> Mapping[str, Any] | None:
    """The subschema ``ref`` (``#``, ``#/json/pointer`` or ``#anchor``) names in
    ``base``, or None if it names nothing there."""
    fragment = unquote(ref[1:])
    if not fragment:
        return base
    if not fragment.startswith("/"):
        return _anchor(base, fragment)
    current: Any = base
    for part in fragment[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return None
    return current if isinstance(current, Mapping) else None


def _anchor(base: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    pending: list[Any] = [base]
    while pending:
        node = pending.pop()
        if isinstance(node, Mapping):
            if name in (node.get("$anchor"), node.get("$dynamicAnchor")):
                return node
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return None
