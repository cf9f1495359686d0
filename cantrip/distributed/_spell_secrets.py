"""A spell queued for workers holds no credential in clear (issues 28.6 and 39.8).

A spec run by workers (``cantrip cast --db``, ``cantrip serve --db``) is stored in
PostgreSQL (``cantrip_work.spell``), so every value of a table field that may carry a
credential (:data:`cantrip._provider_fields.CREDENTIAL_FIELDS`: an MCP server's ``env`` and
``headers``, an A2A agent's ``headers``) must name environment variables, ``"${NAME}"``,
which each worker reads from its own environment when it opens the server or agent.
:func:`check_queued_spell` refuses a literal one before anything is written, naming the
table and key, never the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cantrip._errors import ConstructionError
from cantrip._provider_fields import CREDENTIAL_FIELDS, REFERENCE


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
