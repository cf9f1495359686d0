"""Spells: what a queued cast is built from, and how a worker builds it.

A work item carries its cantrip as data -- a ``module:function`` factory or a spec
file's contents -- because the process that enqueues it is not the one that runs it.
Here are the two ways to write one (the public ``spell_from_*``), the one way to build
one into a :class:`~cantrip.Cantrip` recording into the workers' loom, and the key a
worker caches built spells by.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from cantrip._cantrip import Cantrip
from cantrip._client_gates import CLIENT_TOOLS_KEY
from cantrip._errors import CantripError
from cantrip.distributed._work import (
    ANSWER_KEY,
    CONSOLIDATES_KEY,
    CWD_KEY,
    REWIND_KEY,
    USER_KEY,
)
from cantrip.loom._loom import Loom


def spell_from_factory(path: str) -> dict[str, Any]:
    """A spell the workers build by calling ``module:function`` (it returns a Cantrip)."""
    if ":" not in path:
        raise CantripError(f"a cantrip factory is 'module:function', not {path!r}")
    return {"factory": path}


def spell_from_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A spell the workers build from a spec file's contents (its folder anchors paths)."""
    import tomllib

    file = Path(path).resolve()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CantripError(f"cannot read spec file {path}: {exc}") from None
    data.pop("loom", None)  # the workers' loom is the database
    return {"spec": data, "base_dir": str(file.parent)}


def build_spell(spell: Mapping[str, Any], loom: Loom) -> Cantrip:
    """The cantrip a queued spell describes, recording into ``loom``."""
    if "factory" in spell:
        module, _, name = str(spell["factory"]).partition(":")
        factory = getattr(importlib.import_module(module), name)
        built = factory()
        if not isinstance(built, Cantrip):
            raise CantripError(f"{spell['factory']} returned {type(built).__name__}, not a Cantrip")
        return built.with_(loom=loom)
    # Imported here, not at the top: the spec builder loads every built-in gate and
    # medium, which a program that only queues casts (the Dispatcher) never needs.
    from cantrip.spec import build_cantrip, parse_spec

    doc = parse_spec(spell["spec"], source="queued spec")
    base = spell.get("base_dir")
    return build_cantrip(doc, base_dir=Path(base) if base else None, loom=loom)


def spell_key(spell: Mapping[str, Any]) -> str:
    """The spell a work item's cantrip is built from, as the worker's cache key: without
    what only this item carries (a human's answer, a rollback's rewind point, a front
    end's tools, the session's user, the cast a consolidation consolidates)."""
    only_this = (ANSWER_KEY, REWIND_KEY, CLIENT_TOOLS_KEY, USER_KEY, CWD_KEY, CONSOLIDATES_KEY)
    built = {k: v for k, v in spell.items() if k not in only_this}
    try:  # a key in this process only: orjson's form, several times cheaper (issue 46)
        return orjson.dumps(built, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # what orjson refuses (a big integer): the standard library's form,
        return "=" + json.dumps(built, sort_keys=True)  # never equal to orjson's "{..."
