"""The working context: what the entity perceives, rendered from its loom thread.

The context is never a second source of truth: every message comes from the
identity, an intent, or a recorded turn, in thread order
(SPEC.md "The loom": the loom is the source of truth).
It is rendered *incrementally*: appending a turn renders only that turn, and
:meth:`Context.snapshot` hands the LLM an immutable view in O(1), so a turn
costs O(what is new), not O(history).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol, overload

import attrs

from cantrip._folding import CHARS_PER_TOKEN, AsyncFolder, FoldingPolicy, template_summary
from cantrip._redact import get_logger
from cantrip._running import MEMORY_EXTRA
from cantrip.llm._contract import Message
from cantrip.loom._model import Turn
from cantrip.loom._view import merge_pieces

log = get_logger("cantrip.context")


class ObservationRenderer(Protocol):
    """The part of a medium the context needs: how a recorded turn's observation reads."""

    def render_observation(self, turn: Turn) -> list[Message]: ...


NUDGE_DONE_REQUIRED = (
    "No gate was called. This circle ends only through the done gate: "
    "call done(answer) when the task is complete."
)


class Transcript(Sequence[Message]):
    """An immutable view of the first ``n`` messages of an append-only list."""

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[Message], n: int) -> None:
        self._items = items
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return self._items[: self._n][index]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("transcript index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        items = self._items
        for i in range(self._n):
            yield items[i]

    def backing(self) -> tuple[list[Message], int]:
        """(the append-only list this view reads, how many of its items are in view).

        A renderer that saw this list's first ``k`` items before need only render
        ``items[k:n]`` now, without comparing the prefix item by item (O(history)
        each turn). The list is never changed but appended to: a fold starts a
        new one."""
        return self._items, self._n

    def __repr__(self) -> str:
        return f"Transcript({list(self)!r})"


class Context:
    """Renders identity, intents and turns into messages, one append at a time.

    With a :class:`FoldingPolicy`, older turns are folded into one marked
    summary when a trigger fires; folding starts a fresh list, so snapshots
    already handed out never change. A synchronous folder folds at once, inside
    :meth:`add_turn`; an asynchronous one (:class:`~cantrip._folding.AsyncFolder`)
    leaves the fold *pending* until the owner awaits :meth:`complete_fold`
    (the entity does so at the start of its next turn). Appending a turn is
    never async.

    The token trigger's estimate is the larger of two figures: the characters
    in view divided by :data:`CHARS_PER_TOKEN`, and -- once the provider has
    reported a turn's prompt size -- that measured prompt plus the turn's
    completion plus what was rendered after it (tool definitions and system
    prompt included, since the provider counted them).
    """

    def __init__(
        self,
        system_prompt: str | Message | None,
        medium: ObservationRenderer,
        folding: FoldingPolicy | None = None,
    ) -> None:
        self._medium = medium
        self._folding = folding
        self._system = (
            Message(role="system", content=system_prompt)
            if isinstance(system_prompt, str)
            else system_prompt
        )
        self._items: list[Message] = [self._system] if self._system else []
        self._intent: Message | None = None
        self._memory: Message | None = None
        """What memory added to the current intent's cast (shown right after it)."""
        self._in_view: list[Turn] = []
        """Turns rendered verbatim (delegation pieces merged into one turn)."""
        self._folded: list[Turn] = []
        self._summary: str | None = None
        """The current fold summary's body (without marker and note)."""
        self._chars = 0
        self._measured: int | None = None
        """Provider-measured prompt tokens of the latest turn plus what followed it."""
        self._pending = False
        self._open: Turn | None = None
        """A turn whose utterance is shown but whose observation is still to come."""
        self._steered: tuple[str, ...] | None = None
        """Steering shown live for the turn being taken (its record will carry them)."""

    def add_intent(self, intent: str) -> None:
        self._close_open()
        self._intent = Message(role="user", content=intent)
        self._memory = None
        self._items.append(self._intent)
        self._count(intent)

    def add_memory(self, text: str) -> None:
        """What memory adds to a cast (pinned blocks, recalled items), right after its
        intent. The cast's first turn records it (``extras["memory"]``), so a context
        rebuilt from the loom shows it in the same place without asking the store."""
        self._memory = Message(role="user", content=text)
        self._items.append(self._memory)
        self._count(text)

    def _count(self, text: str) -> None:
        if self._folding is not None:
            self._chars += len(text)
            if self._measured is not None:
                self._measured += len(text) // CHARS_PER_TOKEN

    def add_steering(self, texts: Sequence[str]) -> None:
        """Messages a user sent while the cast ran, shown before the next utterance.

        The turn taken next records them (``extras["steering"]``), so a context
        rebuilt from the loom shows them in the same place; :meth:`add_turn` does not
        show them twice."""
        self._close_open()
        for text in texts:
            self._items.append(Message(role="user", content=text))
            if self._folding is not None:
                self._chars += len(text)
        self._steered = tuple(texts)

    def add_notice(self, text: str) -> None:
        """A budget notice (cantrip._core._budget), shown after this turn's steering
        messages; the turn taken next records it (``extras["budget_notice"]``) and
        :meth:`add_turn` shows it in the same place when the context is rebuilt."""
        shown = self._steered or ()  # this turn's steering, shown already
        self.add_steering((text,))
        self._steered = (*shown, text)

    def add_turn(self, turn: Turn) -> None:
        if turn.intent is not None:
            remembered = recorded_memory(turn)
            if not self._has_pending_intent(turn.intent, remembered):
                self.add_intent(turn.intent)
                if remembered:
                    self.add_memory(remembered)
        phase = turn.extras.get("phase")
        steering = turn.extras.get("steering")
        notice = turn.extras.get("budget_notice")
        if notice:  # a budget notice joins the context like a steering message
            steering = (*(steering or ()), notice)
        if steering and phase not in ("continuation", "continuation+checkpoint"):
            if self._steered == tuple(steering):
                self._steered = None  # shown live already
            else:
                self.add_steering(steering)
                self._steered = None
        if phase not in ("continuation", "continuation+checkpoint"):
            self._close_open()
        if phase == "checkpoint":
            # The utterance is shown now; its observation when the turn completes.
            self._open = turn
            self._items.extend(render_turn(turn, self._medium)[:1])
            return
        if phase == "continuation+checkpoint" and self._open is not None:
            self._open = attrs.evolve(
                self._open, gate_calls=self._open.gate_calls + turn.gate_calls
            )
            return
        if phase == "continuation" and self._open is not None:
            turn = merge_pieces(self._open, turn)
            self._open = None
            rendered = render_turn(turn, self._medium)[1:]
        else:
            rendered = render_turn(turn, self._medium)
        self._items.extend(rendered)
        if self._folding is None:
            return
        self._in_view.append(turn)
        lengths = [m.text_length() for m in rendered]
        added = sum(lengths)
        self._chars += added
        meta = turn.metadata
        if meta.tokens_prompt:
            observed = sum(
                n for n, m in zip(lengths, rendered, strict=True) if m.role != "assistant"
            )
            self._measured = (
                meta.tokens_prompt + meta.tokens_completion + observed // CHARS_PER_TOKEN
            )
        elif self._measured is not None:
            self._measured += added // CHARS_PER_TOKEN
        if self._pending or self._open is not None:
            return
        if self._folding.should_fold(len(self._in_view), self.estimated_tokens):
            if self._folding.deferred:
                self._pending = True
            else:
                self._fold(self._folding)

    def _close_open(self) -> None:
        """Show what a delegating turn recorded when its continuation never came.

        A loom whose process died while a child ran ends at a checkpoint; the
        results recorded up to it are real and belong in the context (the
        transcript renderer completes the calls that have none).
        """
        if self._open is None:
            return
        turn, self._open = self._open, None
        rendered = render_turn(turn, self._medium)[1:]
        self._items.extend(rendered)
        if self._folding is not None:
            self._in_view.append(turn)
            self._chars += sum(len(m.text()) for m in rendered)

    @property
    def estimated_tokens(self) -> int:
        """The token trigger's estimate of the prompt as it stands (see the class doc)."""
        estimate = self._chars // CHARS_PER_TOKEN
        return max(estimate, self._measured) if self._measured is not None else estimate

    @property
    def folded_turns(self) -> int:
        return len(self._folded)

    @property
    def fold_pending(self) -> bool:
        """A trigger fired and the (asynchronous) folder has yet to be awaited."""
        return self._pending

    async def complete_fold(self) -> None:
        """Run a pending fold: await the folder, then re-render (no-op when none is due).

        If the folder fails (an LLM error, an empty answer), the fold still
        happens with the deterministic template summary: folding exists to
        keep the context inside the window, so it must not be skipped.
        """
        policy = self._folding
        if not self._pending or policy is None:
            return
        self._pending = False
        leaving = self._leaving(policy)
        if not leaving:
            return
        folder = policy.folder
        assert isinstance(folder, AsyncFolder)
        try:
            body = await folder.summarize(leaving, self._summary)
        except Exception as exc:  # noqa: BLE001 -- any folder failure falls back (see above)
            log.warning("fold summary failed (%s: %s); using the template", type(exc).__name__, exc)
            body = template_summary([*self._folded, *leaving])
        except BaseException:
            self._pending = True  # cancelled: the fold is still due next time
            raise
        self._apply_fold(policy, leaving, body)

    def _leaving(self, policy: FoldingPolicy) -> list[Turn]:
        keep = policy.keep_recent
        return self._in_view[: max(len(self._in_view) - keep, 0)]

    def _fold(self, policy: FoldingPolicy) -> None:
        leaving = self._leaving(policy)
        if not leaving:
            return
        folder = policy.folder
        assert callable(folder)
        self._apply_fold(policy, leaving, folder([*self._folded, *leaving]))

    def _apply_fold(self, policy: FoldingPolicy, leaving: Sequence[Turn], body: str) -> None:
        self._folded.extend(leaving)
        self._in_view = self._in_view[len(leaving) :]
        self._summary = body
        marker = policy.marker(self._folded[0].sequence, self._folded[-1].sequence)
        summary = Message(
            role="user",
            content=f"{marker}\n{body}\n"
            "(Summary of earlier turns; the full turns are kept in the loom.)",
        )
        items: list[Message] = [self._system] if self._system else []
        if self._intent is not None:
            items.append(self._intent)
            if self._memory is not None:
                items.append(self._memory)
        items.append(summary)
        for turn in self._in_view:
            items.extend(render_turn(turn, self._medium))
        self._items = items
        self._chars = sum(len(m.text()) for m in items)
        self._measured = None  # the provider has not seen the folded prompt yet

    def replay(self, turns: Iterable[Turn]) -> None:
        """Rebuild from a recorded thread (a resumed or forked entity)."""
        for turn in turns:
            self.add_turn(turn)

    def snapshot(self) -> Transcript:
        return Transcript(self._items, len(self._items))

    def _has_pending_intent(self, intent: str, memory: object = None) -> bool:
        """Whether ``intent`` (and what memory added after it) is the last thing shown:
        the cast's first turn, whose intent went in live, does not show it twice."""
        items = self._items
        at = len(items) - 1
        if memory:
            if at < 1 or items[at].content != memory:
                return False
            at -= 1
        last = items[at] if at >= 0 else None
        return last is not None and last.role == "user" and last.content == intent


def recorded_memory(turn: Turn) -> str | None:
    """What memory added after the intent of the cast ``turn`` begins, as recorded
    (``extras["memory"]["text"]``; see :mod:`cantrip._core._cast_context`)."""
    memory = turn.extras.get(MEMORY_EXTRA)
    added = memory.get("text") if isinstance(memory, Mapping) else None
    return str(added) if added else None


def render_turn(turn: Turn, medium: ObservationRenderer) -> list[Message]:
    """One recorded turn as messages: the utterance, then the observation.

    A turn cut off before the LLM answered (an LLM error, a cancellation
    mid-query) has no utterance and renders as nothing.
    """
    if not turn.content and not turn.tool_calls:
        return []
    messages = [
        Message(
            role="assistant",
            content=turn.content,
            tool_calls=turn.tool_calls,
            thinking=turn.thinking,
            reasoning=turn.reasoning,
        )
    ]
    if turn.tool_calls:
        messages.extend(medium.render_observation(turn))
    elif not turn.terminated and turn.observation:
        messages.append(Message(role="user", content=turn.observation))
    return messages
