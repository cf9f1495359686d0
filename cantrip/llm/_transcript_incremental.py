"""Incremental rendering: a growing history rendered again at the cost of what is new.

Why apart from the renderer: :func:`~cantrip.llm._transcript.render_transcript`
is the specification (pure, O(messages)); :class:`IncrementalRenderer` keeps
its engine's state between turns and splits the output into a committed prefix
and an open tail, so a turn costs O(new messages) and the rendered transcript
is handed out as a :class:`RenderedView` made in O(1). It always equals the
full render (the property tests hold it to that).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import overload

from cantrip.llm._contract import Message
from cantrip.llm._transcript import RenderEngine
from cantrip.llm._transcript_model import (
    DEFAULT_POLICY,
    CompletionPolicy,
    ProviderFormat,
    RenderDiagnostics,
)


class RenderedView(Sequence[Message]):
    """An immutable view of a rendered transcript, made in O(1).

    It is the committed prefix (the first ``n`` items of a list that is only
    ever appended to) followed by a small tail tuple. It compares equal to any
    sequence with the same messages; :meth:`as_tuple` (or ``tuple(view)``) copies it.
    """

    __slots__ = ("_items", "_n", "_tail")

    def __init__(self, items: list[Message], n: int, tail: tuple[Message, ...]) -> None:
        self._items = items
        self._n = n
        self._tail = tail

    def __len__(self) -> int:
        return self._n + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return self.as_tuple()[index]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("transcript index out of range")
        if index < self._n:
            return self._items[index]
        return self._tail[index - self._n]

    def __iter__(self) -> Iterator[Message]:
        return itertools.chain(itertools.islice(self._items, self._n), self._tail)

    def as_tuple(self) -> tuple[Message, ...]:
        """The messages as a tuple (a copy: O(messages))."""
        return (*self._items[: self._n], *self._tail)

    def parts(self) -> tuple[list[Message], int, tuple[Message, ...]]:
        """(the append-only list, how many of its items are in the view, the tail).

        Every view a renderer returns shares the list until it rebuilds (then a new
        list), so what was derived from its first items stays valid (adapters keep
        their wire forms of a conversation's messages this way)."""
        return self._items, self._n, self._tail

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RenderedView({list(self)!r})"


class IncrementalRenderer:
    """:func:`render_transcript` for a growing history, paying only for what is new.

    ``extend(new_messages)`` takes the messages appended to the canonical
    history since the last call and returns the whole rendered transcript as a
    :class:`RenderedView`, equal to ``render_transcript(all_messages, ...).messages``.
    The renderer keeps the scan state (calls, id projection, dedupe) and the
    rendered output in two parts: a committed prefix that later appends cannot
    change, and an open tail that is rendered again on each call. The tail
    starts at the latest assistant message while one of its calls has no real
    result (a later result would replace its synthetic completion, and its
    reason turns from ``interrupted`` to ``missing`` once the conversation
    goes on) and, for ``anthropic``/``gemini``, at the last message when the
    next one could merge into it. In the usual loop (an assistant message and
    its results, or a user message) the tail is at most one turn, so a turn
    costs O(new messages) and the view is made in O(1).

    It falls back to a full render (counted in :attr:`full_renders`) only when
    an append changes the committed prefix: a result -- real, or the first
    synthetic one -- for a call of an *older* assistant message that had none
    (or only a synthetic one) when a newer assistant message arrived. That is
    O(messages) once; afterwards appends are incremental again.
    """

    def __init__(
        self,
        provider: ProviderFormat,
        *,
        policy: CompletionPolicy = DEFAULT_POLICY,
        keep_thinking: bool = True,
        reasoning_format: str | None = None,
    ) -> None:
        self._engine = RenderEngine(provider, policy, keep_thinking, reasoning_format)
        self._items: list[Message] = []
        self._open = 0
        """First entry of the open tail."""
        self._started = False
        self._view = RenderedView(self._items, 0, ())
        self.full_renders = 0

    @property
    def provider(self) -> ProviderFormat:
        return self._engine.provider

    @property
    def messages(self) -> RenderedView:
        return self._view

    @property
    def id_map(self) -> Mapping[str, str]:
        return MappingProxyType(self._engine.id_map)

    @property
    def remapped(self) -> bool:
        """Whether :attr:`id_map` maps some id to another (else it is the identity)."""
        return self._engine.remapped

    def extend(self, new_messages: Iterable[Message]) -> RenderedView:
        engine = self._engine
        rebuild = False
        for message in new_messages:
            changed = engine.ingest(message)
            if changed is not None and changed.entry < self._open:
                rebuild = True
        if rebuild:
            self.full_renders += 1
            self._items = []
            self._open = 0
            self._started = False
        start = self._open
        emission = engine.emit(start, self._started)
        cut_entry = engine.open_from(emission, start)
        if cut_entry < len(engine.entries):
            cut = emission.entry_pos[cut_entry - start]
            self._started = emission.entry_started[cut_entry - start]
        else:
            cut = len(emission.messages)
            self._started = emission.started
        out = emission.messages
        if cut:
            self._items.extend(out[:cut] if cut < len(out) else out)
        self._open = cut_entry
        self._view = RenderedView(self._items, len(self._items), tuple(out[cut:]))
        return self._view

    def diagnostics(self) -> RenderDiagnostics:
        """Diagnostics of the whole transcript so far (renders everything: O(messages))."""
        emission = self._engine.emit(0, False)
        return self._engine.diagnostics(emission.messages, emission)
