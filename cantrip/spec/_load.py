"""Reading a spec: TOML text or a mapping to a :class:`SpecDocument`, with positions.

Every problem names where it is -- the file, then the key's dotted path
(``circle.gates[1].name``) -- with a "did you mean" for a misspelt key. A file's
problems come in one run, not one kind per run: when pydantic refuses some keys, the
document without them is built too (nothing opened), and what the build finds
wrong is reported beside them.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import pydantic
from pydantic import BaseModel

from cantrip._errors import ConstructionError
from cantrip._suggest import did_you_mean
from cantrip.spec._build import build_cantrip, dedupe
from cantrip.spec._tables import SpecDocument


def load_spec_file(path: str | Path) -> SpecDocument:
    """Parse and validate a TOML spec file; errors name the file and the key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConstructionError(f"spec file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConstructionError(f"{path}: not valid TOML: {exc}") from None
    try:
        doc = SpecDocument.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = [f"{path}: {p}" for p in _pydantic_problems(exc)]
        raise ConstructionError(dedupe(problems + _problems_past(exc, data, path))) from None
    doc._source = path.resolve()
    return doc


def _problems_past(exc: pydantic.ValidationError, data: Mapping[str, Any], path: Path) -> list[str]:
    """What building would find wrong once the keys pydantic refused are left out
    (unknown gates and wards, a missing done gate...), so a file's mistakes come
    in one run, not one kind per run. Nothing is opened: the build stops at its
    problems, and there is at least one."""
    pruned = copy.deepcopy(dict(data))
    for error in exc.errors():
        _drop(pruned, error["loc"])
    try:
        doc = SpecDocument.model_validate(pruned)
    except pydantic.ValidationError:
        return []  # still not a document: what was said already is what can be said
    doc._source = path.resolve()
    try:
        build_cantrip(doc, base_dir=path.resolve().parent, known_problems=["(pending)"])
    except ConstructionError as more:
        return [f"{path}: {p}" for p in more.problems if p != "(pending)"]
    return []


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    """Remove the value at a pydantic error's ``loc`` (a union member's tag in the
    path, which names no key, is stepped over)."""
    node = data
    for part in loc[:-1]:
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_list or (isinstance(node, dict) and part in node):
            node = node[part]
    if isinstance(node, dict):
        node.pop(loc[-1], None)


def parse_spec(data: Mapping[str, Any], *, source: str = "spec") -> SpecDocument:
    try:
        return SpecDocument.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConstructionError([f"{source}: {p}" for p in _pydantic_problems(exc)]) from None


def _pydantic_problems(exc: pydantic.ValidationError) -> list[str]:
    out = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        if error["type"] == "extra_forbidden":
            key = str(error["loc"][-1])
            out.append(f"unknown key {where!r}{did_you_mean(key, _keys_at(error['loc'][:-1]))}")
        elif error["type"] == "missing":
            out.append(f"missing key {where!r}")
        else:
            out.append(f"{where}: {error['msg']}")
    return out


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the table at ``loc`` of a :class:`SpecDocument` accepts (names and
    aliases), for a "did you mean"; empty where the place has no fixed keys."""
    current: Any = SpecDocument
    for part in loc:
        model = _model_in(current)
        field = None
        if model is not None and isinstance(part, str):
            field = model.model_fields.get(part) or next(
                (f for f in model.model_fields.values() if f.alias == part), None
            )
        if field is not None:
            current = field.annotation
        # else a list index, a dict key or a union member's tag: the same type goes on
    model = _model_in(current)
    if model is None:
        return []
    return [
        name
        for key, field in model.model_fields.items()
        for name in (key, field.alias)
        if name is not None
    ]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model in a type (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
