"""Credentials a spec can carry, in one place: which tables hold them, the ``${NAME}``
form that keeps them out of the spec, and the check that a spec stored for workers
holds none in clear (issues 28.6 and 39.8).

An MCP server's ``env`` and ``headers`` and an A2A agent's ``headers`` are where a spec
puts credentials (a token in ``Authorization``, a key in a server's environment). Each
value may name environment variables, ``"${NAME}"`` (alone or inside text: ``"Bearer
${API_TOKEN}"``), read by the process that opens the server or agent -- as a provider's
key travels as the name in ``api_key_env``, never as the key. A spec run by workers
(``cantrip cast --db``, ``cantrip serve --db``) is stored in PostgreSQL
(``cantrip_work.spell``), so there every such value must take that form:
:func:`check_queued_spell` refuses a literal one before anything is written, naming the
table and key, never the value.

:data:`CREDENTIAL_FIELDS` is the one list of those tables and fields; the MCP and A2A
specs resolve their references with :func:`resolve_references`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cantrip._errors import ConstructionError
from cantrip._redact import register_secret_env

REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""``${NAME}``: an environment variable, read by the process that opens the provider."""

CREDENTIAL_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "mcp": ("env", "headers"),
        "a2a": ("headers",),
    }
)
"""``[[circle.KEY]]`` tables, and their fields whose values may be credentials. A new
table that carries any (headers, an environment, tokens) is listed here, and is then
checked like these: tests/test_spec_secrets.py fails for a circle table it does not know."""


def resolve_references(
    owner: str, fields: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """``fields`` (field -> {key: value}) with every ``${NAME}`` replaced by the variable's
    value in this process; each name becomes a known secret (redacted everywhere). One
    unset variable is a :class:`ConstructionError` naming every one, and ``owner``."""
    missing: list[str] = []
    out: dict[str, dict[str, str]] = {}
    for field, values in fields.items():
        resolved: dict[str, str] = {}
        for key, value in values.items():
            for name in REFERENCE.findall(value):
                register_secret_env(name)
                if name not in os.environ:
                    missing.append(f"{field}.{key} names ${{{name}}}")
            resolved[key] = REFERENCE.sub(lambda m: os.environ.get(m.group(1), ""), value)
        out[field] = resolved
    if missing:
        raise ConstructionError(
            f"{owner}: {', '.join(missing)}, which is not set in this process's environment"
        )
    return out


def check_queued_spell(spell: Mapping[str, Any]) -> None:
    """Refuse a spell for the workers' queue that holds a literal credential: every value
    of every :data:`CREDENTIAL_FIELDS` field must name variables (``"${NAME}"``), which
    each worker reads from its own environment. Called before anything is written; the
    error names each table and key, never a value."""
    spec = spell.get("spec")
    circle = spec.get("circle") if isinstance(spec, Mapping) else None
    if not isinstance(circle, Mapping):
        return
    problems: list[str] = []
    for key, fields in CREDENTIAL_FIELDS.items():
        tables = circle.get(key)
        # One table written as [circle.KEY] instead of [[circle.KEY]] is refused later,
        # by the worker: its values must not reach the queue on the way.
        listed: list[tuple[str, Any]] = (
            [(f"circle.{key}", tables)] if isinstance(tables, Mapping) else []
        )
        if isinstance(tables, list):
            listed = [(f"circle.{key}[{i}]", table) for i, table in enumerate(tables)]
        for where, table in listed:
            if not isinstance(table, Mapping):
                continue
            for field in fields:
                problems.extend(_literals(where, field, table.get(field)))
    if problems:
        raise ConstructionError(problems)


def _literals(table: str, field: str, values: Any) -> list[str]:
    """The problems of one credential field of ``table``: a table of names and values
    (``headers``, ``env``) or a single value (a ``token``), each of which must name
    variables. A problem names where the value is, never the value."""
    if values is None:
        return []
    if isinstance(values, str):
        items = [(f"{table}.{field}", values)]
    elif isinstance(values, Mapping):
        items = [(f"{table}.{field}.{name}", value) for name, value in values.items()]
    else:
        return [f"{table}.{field} must be a table of names and values"]
    return [
        f"{where}: a spec run by workers is stored in the database, so give {field} "
        'values as variables ("${NAME}") that each worker reads from its own environment, '
        "not as literal values"
        for where, value in items
        if not (isinstance(value, str) and REFERENCE.search(value))
    ]


def url_without_secrets(url: str) -> str:
    """A URL without query or user info (either may carry a token)."""
    base = url.split("?", 1)[0].split("#", 1)[0]
    scheme, sep, rest = base.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"
