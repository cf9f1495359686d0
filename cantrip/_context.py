"""The working context: what the entity perceives, rendered from its loom thread.

The context is never a second source of truth: every message comes from the
identity, an intent, or a recorded turn, in thread order (DESIGN principle 1).
It is rendered *incrementally*: appending a turn renders only that turn, and
:meth:`Context.snapshot` hands the LLM an immutable view in O(1), so a turn
costs O(what is new), not O(history).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import attrs

from cantrip._folding import CHARS_PER_TOKEN, FoldingPolicy
from cantrip.llm._contract import Message
from cantrip.loom._model import Turn
from mediums.base import Medium

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

    def __repr__(self) -> str:
        return f"Transcript({list(self)!r})"


class Context:
    """Renders identity, intents and turns into messages, one append at a time.

    With a :class:`FoldingPolicy`, older turns are folded into one marked
    summary when a trigger fires; folding starts a fresh list, so snapshots
    already handed out never change.
    """

    def __init__(
        self, system_prompt: str | None, medium: Medium, folding: FoldingPolicy | None = None
    ) -> None:
        self._medium = medium
        self._folding = folding
        self._system = (
            Message(role="system", content=system_prompt) if system_prompt is not None else None
        )
        self._items: list[Message] = [self._system] if self._system else []
        self._intent: Message | None = None
        self._in_view: list[tuple[Turn, int]] = []
        """Turns rendered verbatim, with the message count each took."""
        self._folded: list[Turn] = []
        self._chars = 0
        self._open: Turn | None = None
        """A turn whose utterance is shown but whose observation is still to come."""

    def add_intent(self, intent: str) -> None:
        self._intent = Message(role="user", content=intent)
        self._items.append(self._intent)
        if self._folding is not None:
            self._chars += len(intent)

    def add_turn(self, turn: Turn) -> None:
        if turn.intent is not None and not self._has_pending_intent(turn.intent):
            self.add_intent(turn.intent)
        phase = turn.extras.get("phase")
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
            turn = attrs.evolve(
                self._open,
                gate_calls=self._open.gate_calls + turn.gate_calls,
                observation=turn.observation,
                terminated=turn.terminated,
                truncated=turn.truncated,
                reason=turn.reason,
                result=turn.result,
                extras={k: v for k, v in turn.extras.items() if k != "phase"},
            )
            self._open = None
            rendered = render_turn(turn, self._medium)[1:]
        else:
            rendered = render_turn(turn, self._medium)
        self._items.extend(rendered)
        if self._folding is None:
            return
        self._in_view.append((turn, len(rendered)))
        self._chars += sum(len(m.text()) for m in rendered)
        if self._folding.should_fold(len(self._in_view), self._chars // CHARS_PER_TOKEN):
            self._fold(self._folding)

    @property
    def folded_turns(self) -> int:
        return len(self._folded)

    def _fold(self, policy: FoldingPolicy) -> None:
        keep = policy.keep_recent
        leaving = [turn for turn, _ in self._in_view[: len(self._in_view) - keep]]
        self._folded.extend(leaving)
        self._in_view = self._in_view[len(self._in_view) - keep :]
        marker = policy.marker(self._folded[0].sequence, self._folded[-1].sequence)
        summary = Message(
            role="user",
            content=f"{marker}\n{policy.folder(self._folded)}\n"
            "(Summary of earlier turns; the full turns are kept in the loom.)",
        )
        items: list[Message] = [self._system] if self._system else []
        if self._intent is not None:
            items.append(self._intent)
        items.append(summary)
        for turn, _count in self._in_view:
            items.extend(render_turn(turn, self._medium))
        self._items = items
        self._chars = sum(len(m.text()) for m in items)

    def replay(self, turns: Iterable[Turn]) -> None:
        """Rebuild from a recorded thread (a resumed or forked entity)."""
        for turn in turns:
            self.add_turn(turn)

    def snapshot(self) -> Transcript:
        return Transcript(self._items, len(self._items))

    def _has_pending_intent(self, intent: str) -> bool:
        last = self._items[-1] if self._items else None
        return last is not None and last.role == "user" and last.content == intent


def render_turn(turn: Turn, medium: Medium) -> list[Message]:
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
        )
    ]
    if turn.tool_calls:
        messages.extend(medium.render_observation(turn))
    elif not turn.terminated and turn.observation:
        messages.append(Message(role="user", content=turn.observation))
    return messages
