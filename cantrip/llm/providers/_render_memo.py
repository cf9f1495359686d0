"""The render memo: each conversation's transcript rendered once, a turn paying for what is new.

Why apart from the adapter: rendering (:mod:`cantrip.llm._transcript`) is pure,
so remembering how far each conversation was rendered is a cache with one
rule -- what it returns equals a full render -- and nothing to do with HTTP.
An adapter holds one :class:`RenderCache` for every entity it serves;
:func:`render` is the uncached render (the LLM-5 re-prompt, tests, benches).
"""

from __future__ import annotations

import logging
import operator
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TypeVar

import attrs

from cantrip._redact import get_logger
from cantrip.llm._contract import Message
from cantrip.llm._transcript import render_transcript
from cantrip.llm._transcript_incremental import IncrementalRenderer
from cantrip.llm._transcript_model import ProviderFormat

log = get_logger("cantrip.llm.providers")

_Value = TypeVar("_Value")


@attrs.frozen
class Rendered:
    """One request's transcript as the adapter sends it, and its id projection."""

    messages: Sequence[Message]
    id_map: Mapping[str, str]
    remapped: bool = True
    """Whether ``id_map`` maps some id to another (``False``: nothing to map back)."""


def render(
    messages: Sequence[Message],
    family: ProviderFormat,
    keep_thinking: bool,
    reasoning_format: str | None = None,
) -> Rendered:
    """The transcript made provider-valid by :func:`cantrip.llm._transcript.render_transcript`.

    Interaction repair (pairing, adjacency, dedupe, synthetic completions, id
    projection) belongs to the renderer alone; adapters only translate shape.
    """
    result = render_transcript(
        messages, family, keep_thinking=keep_thinking, reasoning_format=reasoning_format
    )
    diagnostics = result.diagnostics
    if log.isEnabledFor(logging.DEBUG) and (
        diagnostics.synthetic_completions
        or diagnostics.dropped_orphan_results
        or diagnostics.dedupe_decisions
        or diagnostics.moved_results
    ):
        log.debug("transcript repaired for %s: %s", family, diagnostics.to_dict())
    id_map = result.id_map
    return Rendered(result.messages, id_map, any(key != wire for key, wire in id_map.items()))


@attrs.define
class _Memo:
    renderer: IncrementalRenderer
    seen: list[Message]
    """The messages rendered: a copy, or an append-only list the caller shares
    (``backing()``), of which the first :attr:`rendered` were rendered."""
    rendered: int = -1
    """For a shared list: how many of its items were rendered (-1: ``seen`` is a copy)."""


RENDER_MEMOS = 1024
"""Conversations an adapter remembers having rendered (the least recently used is dropped)."""


class RenderCache:
    """Incremental rendering across calls, so a turn costs O(new messages).

    A pure memo: what it returns always equals ``render_transcript`` of the
    whole history (the renderer guarantees it); it only remembers how far each
    recent conversation was already rendered. A call whose messages begin
    with exactly the message objects seen before (a growing context) renders
    only the new ones; anything else (a folded context, a new entity) starts a
    fresh renderer, and the least recently used of ``size`` is dropped.

    One adapter serves every entity of a server at once, so ``size`` must
    cover the conversations in flight (200 sessions prompting at once missed
    a memo of 8 on every call and re-rendered every history), and finding a
    conversation must not cost a scan of all of them: memos are found by the
    identity of the last message they saw, looked up from the newest message
    backwards (a turn adds a few), then the whole prefix is checked object by
    object (a C loop over references; the request body is O(history) anyway).
    A memo holds only the messages its entity holds, plus their rendered view.
    """

    def __init__(
        self,
        family: ProviderFormat,
        keep_thinking: bool,
        size: int = RENDER_MEMOS,
        reasoning_format: str | None = None,
    ) -> None:
        self.family = family
        self.keep_thinking = keep_thinking
        self.reasoning_format = reasoning_format
        self.size = size
        self._memos: OrderedDict[int, _Memo] = OrderedDict()
        """By ``id`` of the last message each saw (kept alive by ``seen``), or of the
        shared list it reads (:meth:`_render_shared`); least recently used first."""

    def render(self, messages: Sequence[Message]) -> Rendered:
        backing = getattr(messages, "backing", None)
        if backing is not None:
            return self._render_shared(*backing())
        memos = self._memos
        for last in range(len(messages) - 1, -1, -1):
            memo = memos.get(id(messages[last]))
            if memo is None:
                continue
            seen = memo.seen
            if len(seen) == last + 1 and all(map(operator.is_, seen, messages)):
                new = messages[last + 1 :]
                view = memo.renderer.extend(new)
                if new:
                    del memos[id(seen[-1])]
                    seen.extend(new)
                    memos[id(seen[-1])] = memo
                else:
                    memos.move_to_end(id(seen[-1]))
                return _rendered(memo.renderer, view)
            break  # the conversation changed (folded, forked): render it afresh
        renderer = self._fresh()
        seen = list(messages)
        view = renderer.extend(seen)
        if seen:
            remember(self._memos, id(seen[-1]), _Memo(renderer, seen), self.size)
        return _rendered(renderer, view)

    def _render_shared(self, items: list[Message], n: int) -> Rendered:
        """The first ``n`` of an append-only list (a context's :class:`Transcript`):
        its memo is found by the list and renders ``items[k:n]``, the messages
        added since it rendered ``k`` -- O(new messages), however long the history."""
        key = id(items)
        memo = self._memos.get(key)
        if memo is not None and memo.seen is items and 0 <= memo.rendered <= n:
            view = memo.renderer.extend(items[memo.rendered : n])
            memo.rendered = n
            self._memos.move_to_end(key)
            return _rendered(memo.renderer, view)
        renderer = self._fresh()
        view = renderer.extend(items[:n])
        # replaces an earlier, longer view's
        remember(self._memos, key, _Memo(renderer, items, n), self.size)
        return _rendered(renderer, view)

    def _fresh(self) -> IncrementalRenderer:
        return IncrementalRenderer(
            self.family, keep_thinking=self.keep_thinking, reasoning_format=self.reasoning_format
        )


def remember(memos: OrderedDict[int, _Value], key: int, value: _Value, size: int) -> None:
    """Keep ``value`` as the newest of ``memos`` under ``key``; drop the least recently
    used over ``size`` (the render memo's and an adapter's own per-conversation memos)."""
    memos.pop(key, None)
    memos[key] = value
    while len(memos) > size:
        memos.popitem(last=False)


def _rendered(renderer: IncrementalRenderer, view: Sequence[Message]) -> Rendered:
    return Rendered(view, renderer.id_map, renderer.remapped)
