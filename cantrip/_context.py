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
    """Renders identity, intents and turns into messages, one append at a time."""

    def __init__(self, system_prompt: str | None, medium: Medium) -> None:
        self._medium = medium
        self._items: list[Message] = []
        if system_prompt is not None:
            self._items.append(Message(role="system", content=system_prompt))

    def add_intent(self, intent: str) -> None:
        self._items.append(Message(role="user", content=intent))

    def add_turn(self, turn: Turn) -> None:
        if turn.intent is not None and not self._has_pending_intent(turn.intent):
            self.add_intent(turn.intent)
        self._items.extend(render_turn(turn, self._medium))

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
    """One recorded turn as messages: the utterance, then the observation."""
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
