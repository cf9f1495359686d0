"""What ``cast --json`` prints, in one shape whether the cast ran here or at a worker.

``cast --json`` builds its data from the cast's result
(:func:`cantrip._outcome.result_dict`); ``cast --db --json`` from the
outcome a worker recorded in the queue. Both print through :func:`print_cast_json`,
which gives every key of the shape (``None`` where the outcome does not know it)
and adds where the loom is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cantrip._outcome import stop_reason_for
from cantrip._redact import redact_value

CAST_KEYS = (
    "result",
    "terminated",
    "truncated",
    "reason",
    "stop_reason",
    "turns",
    "entity_id",
    "usage",
    "cost_usd",
    "summary",
)
"""The keys of every ``cast --json`` object (then ``loom``; ``--db`` adds ``state`` and
``work_id``; a paused cast ``pending``, a cut-off answer ``partial``)."""


def cast_json(
    data: Mapping[str, Any], *, loom: str | None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The one shape: :data:`CAST_KEYS` in order, then the rest, ``loom`` and ``extra``."""
    shaped: dict[str, Any] = dict(extra or {})
    for key in CAST_KEYS:
        shaped[key] = data.get(key)
    if shaped["stop_reason"] is None:
        shaped["stop_reason"] = stop_reason_for(bool(data.get("terminated")), data.get("reason"))
    for key, value in data.items():
        shaped.setdefault(key, value)
    shaped["loom"] = loom
    return shaped


def print_cast_json(
    data: Mapping[str, Any], *, loom: str | None, extra: Mapping[str, Any] | None = None
) -> None:
    print(json.dumps(redact_value(cast_json(data, loom=loom, extra=extra)), default=str))
