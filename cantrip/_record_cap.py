"""The record cap: what a gate-call record stores of a huge result (issue 28, item 10).

The observation cap (``max_observation_chars``) keeps a 30 MB gate result out of
the model's context, but the gate-call record kept all of it, so the loom, the
gate journal and every export grew by 30 MB per call. A record now stores at
most ``max_record_chars`` characters of its result (a ward; default
:data:`RECORD_CAP_CHARS`); the rest is not stored, and the record says so:

* ``result`` becomes the first ``max_record_chars`` characters of the result's
  text (a string result as it is; any other value as its compact JSON), then a
  line ``[cut: N of M characters not stored (max_record_chars=L); sha256 H]``;
* ``detail["result_cut"]`` holds ``{"chars": M, "kept": L, "sha256": H}``, plus
  ``"json": true`` when the text is the JSON of a non-string value -- a field
  exports and the viewer can show, and a replay notices.

The hash is of the full text's UTF-8 bytes, so a user holding the whole result
elsewhere can tell it is the one the gate returned. The medium saw the whole
value during the turn (code works with the data); only what is stored is cut.
The cap is applied where every turn passes on its way to the loom
(``Entity._record``) and where the gate journal stores a completed call, so
no path stores more. It is checked by a walk that stops once it has counted
more than the limit: an ordinary result costs microseconds. Cutting a huge
one (encoding and hashing it) is linear in its size and happens once, on the
event loop (about 40 ms for a 30 MB text) -- less than the loop already spent
receiving it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs
import orjson

from cantrip._wards import WardSet
from cantrip.loom._model import GateCallRecord, Turn

RECORD_CAP_CHARS = 1_048_576
"""Default characters of one gate result a record stores (``max_record_chars`` ward):
16 times the default observation cap, so a record always holds more than the model
saw, and a loom of ordinary results is never cut."""


def over_cap(record: GateCallRecord, limit: int) -> bool:
    """Whether ``record``'s result is longer than ``limit`` characters as text."""
    value = record.result
    if isinstance(value, str):
        return len(value) > limit
    if value is None or isinstance(value, bool | int | float):
        return False
    if _at_least(value, limit) > limit:
        return True
    return len(_json_text(value)) > limit  # small enough to encode on the spot


def cap_record(record: GateCallRecord, limit: int) -> GateCallRecord:
    """``record`` with its result cut to ``limit`` characters (see the module docstring);
    unchanged when it fits."""
    value = record.result
    encoded = not isinstance(value, str)
    text = _json_text(value) if encoded else value
    if len(text) <= limit:
        return record
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    cut: dict[str, Any] = {"chars": len(text), "kept": limit, "sha256": digest}
    if encoded:
        cut["json"] = True
    kept = (
        f"{text[:limit]}\n[cut: {len(text) - limit} of {len(text)} characters not stored "
        f"(max_record_chars={limit}); sha256 {digest}]"
    )
    return attrs.evolve(record, result=kept, detail={**record.detail, "result_cut": cut})


def capped_turn(turn: Turn, limit: int) -> Turn:
    """``turn`` with every gate result over ``limit`` cut; the same turn (no copy)
    when all fit -- every ordinary turn. A record already cut is left as it is."""
    records = turn.gate_calls
    over = [i for i, r in enumerate(records) if "result_cut" not in r.detail and over_cap(r, limit)]
    if not over:
        return turn
    cut = list(records)
    for i in over:
        cut[i] = cap_record(cut[i], limit)
    return attrs.evolve(turn, gate_calls=tuple(cut))


def record_cap(wards: WardSet) -> int:
    """The ``max_record_chars`` of resolved wards, or the default."""
    value = wards.get("max_record_chars")
    return RECORD_CAP_CHARS if value is None else int(value)


def _json_text(value: Any) -> str:
    """``value`` as compact JSON, as the loom writes it (orjson; the standard library
    for what orjson refuses: big integers, lone surrogates)."""
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)


def _at_least(value: Any, limit: int) -> int:
    """A lower bound of ``value``'s JSON length that stops counting past ``limit``
    (so a huge value costs no more than a small one)."""
    total = 0
    stack: list[Any] = [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, Mapping):
            total += 2 + 2 * len(item)
            for key, inner in item.items():
                total += len(str(key)) + 2
                if total > limit:
                    break
                stack.append(inner)
        elif isinstance(item, list | tuple):
            total += 2 + len(item)
            if total <= limit:
                stack.extend(item)
        else:
            total += 1
    return total
