"""A recorded cast turned into a regression case (``cantrip eval add LOOM REF``).

The cast (a bug seen in production, a fork made in the viewer) is copied with its
children into the suite's recording loom, and the suite gains a case with the
cast's intent and what the recording shows: how it ended, its result, the gates it
called in order. Replaying the suite then re-runs the agent on exactly that
conversation; a change that makes the agent ask anything else diverges there.

Only a cast that opens its entity's thread can become a case: a later cast of a
long-lived session was answered with the session's history in view, which a fresh
case does not have.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from cantrip._errors import CantripError, LoomError
from cantrip.evals._suite import Case, Expect, load_suite
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn

RECORDING_SUFFIX = ".recording.jsonl"


def add_case(
    loom: Loom,
    ref: str,
    suite_path: str | Path,
    *,
    name: str | None = None,
    spec: str | None = None,
) -> Case:
    """Append the cast ``ref`` names (an entity id or a turn id) to the suite file as
    a case, and its recording to the suite's recording loom; return the case.

    ``spec`` (a path as the caller sees it) is written relative to the suite file, the
    way a suite's ``spec`` is read back, so ``cantrip eval SUITE --replay`` runs next
    from any folder; a suite that names a spec already keeps its own."""
    suite_path = Path(suite_path)
    if spec is not None:
        spec = os.path.relpath(Path(spec).resolve(), suite_path.resolve().parent)
    turns = _cast_turns(loom, ref)
    first = turns[0]
    assert first.intent is not None
    last = turns[-1]
    calls = [r.gate for t in turns for r in t.gate_calls if r.status in ("ok", "error")]
    expect: dict[str, Any] = {"ended": "terminated" if last.terminated else "truncated"}
    if last.reason:
        expect["reason"] = last.reason
    if last.terminated and last.result is not None:
        expect["result_equals"] = last.result
    if calls:
        expect["gates"] = calls
    case = Case(
        name=name or f"{first.entity_id[:12]}", intent=first.intent, expect=Expect(**expect)
    )

    existing = load_suite(suite_path) if suite_path.exists() else None
    if existing is not None and any(c.name == case.name for c in existing.cases):
        raise CantripError(f"{suite_path}: a case named {case.name!r} exists already (--name)")
    text = suite_path.read_text(encoding="utf-8") if suite_path.exists() else ""
    data = yaml.safe_load(text) if text.strip() else {}
    recording_name = (data or {}).get("recording") or suite_path.stem + RECORDING_SUFFIX
    recording = Loom.open(suite_path.parent / recording_name)
    try:
        _copy_cast(loom, recording, turns)
    finally:
        recording.close()
    suite_path.write_text(
        _with_case(text, case, recording_name if "recording" not in (data or {}) else None, spec),
        encoding="utf-8",
    )
    return case


def _cast_turns(loom: Loom, ref: str) -> list[Turn]:
    """The turns of the cast ``ref`` names: its entity's first cast, or the cast holding
    that turn."""
    if loom.has_entity(ref):
        entity_id, turn_id = ref, None
    else:
        try:
            turn = loom.get(ref)
        except LoomError:
            raise CantripError(
                f"{ref!r} is neither an entity nor a turn of this loom "
                "(cantrip loom FILE list shows them)"
            ) from None
        entity_id, turn_id = turn.entity_id, turn.id
    turns = list(loom.entity_turns(entity_id))
    if not turns:
        raise CantripError(f"entity {entity_id} has no turns")
    starts = [i for i, t in enumerate(turns) if t.intent is not None]
    index = 0 if turn_id is None else next(i for i, t in enumerate(turns) if t.id == turn_id)
    start = max((s for s in starts if s <= index), default=0)
    if start != 0:
        raise CantripError(
            "only the first cast of an entity can become a case: this cast was answered "
            "with the session's earlier casts in view"
        )
    end = next((s for s in starts if s > start), len(turns))
    return turns[start:end]


def _copy_cast(source: Loom, target: Loom, turns: list[Turn]) -> None:
    """The cast's entity, turns and children (with theirs) into ``target``."""
    entity_id = turns[0].entity_id
    if target.has_entity(entity_id):
        return
    target.register_entity(source.entity(entity_id))
    for turn in turns:
        target.append(turn)
    _copy_children(source, target, {t.id for t in turns})


def _copy_children(source: Loom, target: Loom, parent_ids: set[str]) -> None:
    for child_id, record in source.entities.items():
        if record.spawned_from in parent_ids and not target.has_entity(child_id):
            child_turns = list(source.entity_turns(child_id))
            target.register_entity(record)
            for turn in child_turns:
                target.append(turn)
            _copy_children(source, target, {t.id for t in child_turns})


def _with_case(text: str, case: Case, recording: str | None, spec: str | None) -> str:
    """The suite text with the case appended, comments kept.

    A new suite is written whole; an existing one gains its case at the end of its
    ``cases`` list (which must then be the file's last top-level key) and, when it
    had none, a ``recording`` line at the top."""
    entry = yaml.safe_dump(
        [case.model_dump(exclude_defaults=True, mode="json")], sort_keys=False, allow_unicode=True
    )
    if not text.strip():
        head = f"spec: {spec}\n" if spec else ""
        return f"{head}recording: {recording}\ncases:\n" + _indent(entry)
    top_keys = re.findall(r"^([A-Za-z_][\w-]*):", text, flags=re.MULTILINE)
    if not top_keys or top_keys[-1] != "cases":
        raise CantripError(
            "the suite's 'cases' list must be its last top-level key for eval add to append to it"
        )
    out = text if text.endswith("\n") else text + "\n"
    out += _indent(entry)
    if recording is not None:
        out = f"recording: {recording}\n" + out
    if spec is not None and "spec" not in top_keys:
        out = f"spec: {spec}\n" + out
    return out


def _indent(block: str) -> str:
    return "".join("  " + line if line.strip() else line for line in block.splitlines(True))
