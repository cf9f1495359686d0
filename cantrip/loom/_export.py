"""Exporting a loom: JSONL of turns, redacted unless raw output is asked for.

Schema (one JSON object per line, in recording order): every field of
:meth:`Turn.to_dict` plus ``reward``. Secrets are redacted by default
(PROD-8); ``redaction="none"`` is the explicit opt-in to raw output.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Literal

from cantrip._redact import redact_value
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn

Redaction = Literal["default", "none"]


def export_jsonl(
    loom: Loom, turns: Iterable[Turn] | None = None, *, redaction: Redaction = "default"
) -> str:
    """The given turns (default: the whole loom) as JSONL text."""
    lines = []
    for turn in loom.turns if turns is None else turns:
        record = {**turn.to_dict(), "reward": loom.reward(turn.id)}
        if redaction == "default":
            record = redact_value(record)
        elif redaction != "none":
            raise ValueError(f"unknown redaction {redaction!r} (default or none)")
        lines.append(json.dumps(record, ensure_ascii=False, default=str))
    return "\n".join(lines) + ("\n" if lines else "")
