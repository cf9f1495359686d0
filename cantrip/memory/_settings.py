"""What a cantrip's memory is made of: the namespace template, pinned blocks, recall.

:class:`MemorySettings` is the Python face of a spec's ``[memory]`` table
(:mod:`cantrip.spec._memory`). It is a value checked when it is made, so a bad
template or block is refused at construction, one clear line each, not at the first
cast. The namespace is a template because a cantrip serves many sessions: its parts
are filled per cast from what the session knows -- the user the cast is for (the
``user`` tag of :meth:`Entity.send`), the entity, the cantrip's name.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

import attrs

from cantrip._errors import ConstructionError
from cantrip.llm._embed_contract import Embedder
from cantrip.memory._model import (
    MAX_DEPTH,
    MemoryStoreError,
    Namespace,
    check_key,
    check_namespace,
)
from cantrip.memory._store import MemoryBackend

PLACEHOLDERS = ("user", "entity", "cantrip")
"""What a namespace part may name in braces: ``("user", "{user}")``."""
USER_TAG = "user"
"""The cast tag (``Entity.send(intent, tags={"user": "alice"})``) that names its user."""
MAX_BLOCK_CHARS = 100_000
"""The largest limit a pinned block may declare (its text is in every request)."""
MAX_RECALL_K = 50
"""Items automatic recall may place in a prompt at most."""
CONSOLIDATE_AFTER = ("cast",)
"""When consolidation may run: after each cast that ends (the only choice today; a
memory without :class:`Consolidate` never consolidates)."""
BLOCKS_PART = "_blocks"
"""The namespace part under which pinned blocks are stored: ``(*namespace, "_blocks")``."""
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


@attrs.frozen
class MemoryBlock:
    """A pinned block: labelled text the entity sees at the start of every cast and
    edits through the ``edit_block`` gate, never longer than ``limit`` characters."""

    label: str
    text: str = ""
    limit: int = 2000

    def __attrs_post_init__(self) -> None:
        problems = block_problems(self.label, self.text, self.limit)
        if problems:
            raise ConstructionError(problems)


def block_problems(label: object, text: object, limit: object) -> list[str]:
    """What is wrong with a block's fields (empty: nothing)."""
    problems = []
    if not isinstance(label, str) or not _LABEL.match(label):
        problems.append(
            f"memory block label {label!r}: letters, digits, '_' and '-', "
            "at most 64, starting with a letter or '_'"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BLOCK_CHARS:
        problems.append(
            f"memory block {label!r}: limit is an integer from 1 to {MAX_BLOCK_CHARS}; "
            f"got {limit!r}"
        )
    elif not isinstance(text, str):
        problems.append(f"memory block {label!r}: text is a string")
    elif len(text) > limit:
        problems.append(
            f"memory block {label!r}: its text has {len(text)} characters, over its limit "
            f"of {limit}"
        )
    return problems


def template_problems(template: object) -> list[str]:
    """What is wrong with a namespace template (empty: nothing). A part is literal
    text or holds ``{user}``, ``{entity}`` or ``{cantrip}``; a literal part must be a
    valid namespace part as it stands."""
    if isinstance(template, str) or not isinstance(template, tuple | list):
        return [
            f"memory namespace is a list of strings, such as ['user', '{{user}}']; got {template!r}"
        ]
    if not template:
        return ["memory namespace needs at least one part"]
    if len(template) > MAX_DEPTH - 1:  # one part is kept for the blocks' namespace
        return [f"memory namespace has at most {MAX_DEPTH - 1} parts; it has {len(template)}"]
    problems = []
    for part in template:
        if not isinstance(part, str):
            problems.append(f"memory namespace part {part!r} is not a string")
            continue
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(part) if f is not None]
        except ValueError as exc:
            problems.append(f"memory namespace part {part!r}: {exc}")
            continue
        unknown = [n for n in names if n not in PLACEHOLDERS]
        if unknown:
            problems.append(
                f"memory namespace part {part!r} names {{{unknown[0]}}}; a part may name "
                + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
            )
            continue
        literal = part.format(**{p: "x" for p in PLACEHOLDERS})
        try:
            check_namespace((literal,))
        except MemoryStoreError as exc:
            problems.append(f"memory namespace part {part!r}: {exc}")
    return problems


def _as_optional_tuple(value: Any) -> Any:
    return None if value is None else _as_tuple(value)


@attrs.frozen(eq=False)
class Consolidate:
    """Consolidation (``MemorySettings(consolidate=...)``, a spec's ``[memory.consolidate]``):
    after each cast ends, ``cantrip`` -- a cantrip of its own, its LLM, identity, wards
    and budget, usually with ``remember``, ``recall``, ``forget`` and ``done`` -- is cast
    in the background on the finished cast's transcript, to extract and merge facts
    into ``namespace`` (a template as :attr:`MemorySettings.namespace`; default the
    memory's own). Every item it writes names the turns it was drawn from
    (:mod:`cantrip.memory._consolidate`)."""

    cantrip: Any
    """The consolidator (a :class:`~cantrip.Cantrip`; its loom and memory are set for
    each source cantrip: the source's loom, the consolidation namespace)."""
    namespace: tuple[str, ...] | None = attrs.field(default=None, converter=_as_optional_tuple)
    after: str = "cast"

    def __attrs_post_init__(self) -> None:
        problems = [] if self.namespace is None else template_problems(self.namespace)
        problems = [p.replace("memory namespace", "consolidate namespace") for p in problems]
        if self.after not in CONSOLIDATE_AFTER:
            problems.append(
                f"consolidate after is {' or '.join(map(repr, CONSOLIDATE_AFTER))}; "
                f"got {self.after!r}"
            )
        if not callable(getattr(self.cantrip, "with_", None)):
            problems.append(
                f"consolidate cantrip must be a Cantrip; got {type(self.cantrip).__name__}"
            )
        if problems:
            raise ConstructionError(problems)


def _as_tuple(value: Any) -> Any:
    """A list as a tuple; anything else as given, for the checks to name (a string
    made a tuple would be its characters)."""
    return tuple(value) if isinstance(value, list | tuple) else value


@attrs.frozen(eq=False)
class MemorySettings:
    """A cantrip's memory (``Cantrip(memory=MemorySettings(...))``).

    ``namespace`` is a template (see :data:`PLACEHOLDERS`); ``blocks`` are pinned;
    ``recall`` places the ``recall_k`` items that best match a cast's intent in its
    context. ``name`` fills ``{cantrip}`` (default: the cantrip's id; a spec file
    uses its file name). ``store`` is where items live; by default the memory store
    beside the cantrip's loom (:func:`cantrip.memory.memory_for`), opened with
    ``embedder`` when one is given (searches by meaning too; a spec's
    ``[memory] embedder = {...}``)."""

    namespace: tuple[str, ...] = attrs.field(default=("{cantrip}",), converter=_as_tuple)
    blocks: tuple[MemoryBlock, ...] = attrs.field(default=(), converter=_as_tuple)
    recall: bool = False
    recall_k: int = 5
    name: str | None = None
    store: MemoryBackend | None = None
    embedder: Embedder | None = None
    consolidate: Consolidate | None = None
    """Consolidation after each cast (off: None, the default)."""
    _opened: dict[int, tuple[object, MemoryBackend]] = attrs.field(
        factory=dict, init=False, repr=False
    )
    """The store opened beside each loom store (by identity, the loom store kept with
    it so that its id is not reused): opened once per loom."""

    def __attrs_post_init__(self) -> None:
        problems = template_problems(self.namespace)
        labels = [b.label for b in self.blocks]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            problems.append(f"memory block {twice[0]!r} is declared twice")
        k = self.recall_k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_RECALL_K:
            problems.append(f"memory recall_k is an integer from 1 to {MAX_RECALL_K}; got {k!r}")
        consolidate: object = self.consolidate
        if consolidate is not None and not isinstance(consolidate, Consolidate):
            problems.append(
                f"memory consolidate must be a Consolidate; got {type(consolidate).__name__}"
            )
        if self.name is not None:
            try:
                check_key(self.name)
            except MemoryStoreError as exc:
                problems.append(f"memory name: {exc}")
        if problems:
            raise ConstructionError(problems)

    @property
    def needs_user(self) -> bool:
        return any("{user}" in part for part in self.namespace)

    @property
    def consolidation_namespace(self) -> tuple[str, ...]:
        """The template consolidation writes under: its own, or the memory's."""
        own = self.consolidate.namespace if self.consolidate is not None else None
        return own if own is not None else self.namespace

    def fill(self, *, user: str | None, entity: str, cantrip: str) -> Namespace:
        """The namespace of one cast, or :class:`MemoryStoreError` saying why not (a
        template naming ``{user}`` for a cast that names none)."""
        if self.needs_user and not user:
            raise MemoryStoreError(
                f"this cantrip's memory namespace {list(self.namespace)} needs a user: "
                f"send the cast with tags={{'{USER_TAG}': ...}}"
            )
        values = {"user": user or "", "entity": entity, "cantrip": self.name or cantrip}
        namespace = tuple(part.format(**values) for part in self.namespace)
        check_namespace(namespace)
        return namespace

    def block(self, label: str) -> MemoryBlock | None:
        return next((b for b in self.blocks if b.label == label), None)


def user_of(tags: Mapping[str, Any]) -> str | None:
    """The user a cast is for, from its tags (None: not said)."""
    user = tags.get(USER_TAG)
    if user is None:
        return None
    if not isinstance(user, str):
        raise MemoryStoreError(f"the {USER_TAG!r} tag is a string; got {type(user).__name__}")
    return user
