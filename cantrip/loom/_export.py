"""Exporting a loom's turns as JSONL, and reading them back.

Exports are redacted by default (PROD-8): every string passes through
:func:`cantrip._redact.redact` (:func:`redact_export`, which the chat-format export
uses too). ``redaction="none"`` is the explicit opt-in to raw output.

**Turn JSONL** (``export_jsonl``, ``export_thread_jsonl``; read back with
``load_jsonl``). One JSON object per line, in recording order (a thread: root
first). Schema ``cantrip.turn/1``, the fields of :meth:`Turn.to_dict` plus
``reward``:

- ``id``, ``parent_id`` (null for a root), ``entity_id``, ``cantrip_id``,
  ``role`` (``"turn"``), ``sequence`` (1-based per entity, continuing across
  casts and from a fork point), ``intent`` (on a cast's first turn, else null);
- ``utterance`` (the reply as text), ``content``, ``thinking``, ``tool_calls``
  (``[{id, name, arguments, raw_arguments}]``);
- ``reasoning`` (only when the utterance has any: ``[{format, position, kind,
  payload, text?, redacted?}]``, opaque provider artefacts replayed byte for
  byte; a redacted export leaves out an artefact redaction would alter);
- ``observation`` (text), ``gate_calls`` (``[{gate, args, result, is_error,
  tool_call_id, status, duration_ms, detail?}]``; ``status`` is ``ok``,
  ``error``, ``skipped``, ``cancelled`` or ``crashed``);
- ``metadata`` (``{tokens_prompt, tokens_completion, tokens_cached,
  duration_ms, timestamp, attempts, model, provider}``);
- ``terminated``, ``truncated``, ``reason``, ``result``, ``extras``;
- ``reward`` (number or null).

Unknown fields are ignored when reading, so the schema may grow by adding
fields; a field's meaning never changes within ``/1``.

Chat-format export (``export_chat``) renders a thread through the entity's prompt
context, which stands above the loom: it is :mod:`cantrip._chat_export`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import attrs

from cantrip._redact import redact_value
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn

Redaction = Literal["default", "none"]
SCHEMA = "cantrip.turn/1"


def redact_export(record: Any, redaction: Redaction) -> Any:
    """``record`` as an export writes it: redacted (``default``) or raw (``none``)."""
    if redaction == "default":
        reasoning = record.get("reasoning") if isinstance(record, dict) else None
        if not reasoning:
            return redact_value(record)
        # An artefact is replayed byte for byte or not at all: redaction may not edit
        # one (a signature would no longer verify), so one it would change is left out.
        kept = [part for part in reasoning if redact_value(part) == part]
        out = redact_value({k: v for k, v in record.items() if k != "reasoning"})
        if kept:
            out["reasoning"] = kept
        return out
    if redaction != "none":
        raise ValueError(f"unknown redaction {redaction!r} (default or none)")
    return record


def export_jsonl(
    loom: Loom, turns: Iterable[Turn] | None = None, *, redaction: Redaction = "default"
) -> str:
    """The given turns (default: the whole loom) as JSONL text."""
    lines = []
    for turn in loom.turns if turns is None else turns:
        record = redact_export({**turn.to_dict(), "reward": loom.reward(turn.id)}, redaction)
        lines.append(json.dumps(record, ensure_ascii=False, default=str))
    return "\n".join(lines) + ("\n" if lines else "")


def export_thread_jsonl(loom: Loom, leaf_id: str, *, redaction: Redaction = "default") -> str:
    """One thread (root to ``leaf_id``, LOOM-10) as turn JSONL."""
    return export_jsonl(loom, loom.thread(leaf_id), redaction=redaction)


@attrs.frozen
class ExportedTurn:
    """One line of a turn export, read back."""

    turn: Turn
    reward: float | None = None


def load_jsonl(source: str | os.PathLike[str]) -> list[ExportedTurn]:
    """Read a turn export: JSONL text, or the path of a file holding it.

    The inverse of :func:`export_jsonl`: exporting, loading and exporting again
    gives the same text. Raises ``ValueError`` naming the line of a record
    that is not a turn.
    """
    text = source if isinstance(source, str) else Path(source).read_text(encoding="utf-8")
    out: list[ExportedTurn] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            reward = data.get("reward")
            out.append(
                ExportedTurn(Turn.from_dict(data), None if reward is None else float(reward))
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"line {number}: not a turn record ({exc})") from exc
    return out
