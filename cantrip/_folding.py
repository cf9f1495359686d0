"""Folding: older turns leave the working context as one marked summary (6.8).

Folding is a view transformation (LOOM-5): the loom keeps every turn, and the
entity's context is re-rendered as ``[system] [current intent] [folded
summary] [recent turns]``. The identity and the gate definitions are never
folded (LOOM-6, IDENTITY-5) -- gate definitions travel in ``tools`` and are
untouched -- and whole turns fold together, so a tool call and its result are
never split (seed 001 section 8).

Triggers (D-007): more than ``trigger_after_turns`` turns in view, or the
estimated prompt above ``trigger_ratio`` (default 80 %) of ``context_window``
tokens when a window is known. Whichever comes first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from cantrip.loom._model import Turn
from mediums.base import visible_result

Folder = Callable[[Sequence[Turn]], str]
"""Writes the summary text for a range of turns."""

CHARS_PER_TOKEN = 4
"""The estimate used for the token trigger when no tokenizer is at hand."""


def template_summary(turns: Sequence[Turn]) -> str:
    """The default folder: one deterministic line per turn."""
    lines = []
    for turn in turns:
        if turn.intent is not None:
            lines.append(f"- intent: {turn.intent}")
        if turn.gate_calls:
            calls = "; ".join(
                f"{r.gate}({r.arguments}) -> "
                f"{'ERROR ' if r.is_error else ''}{_short(visible_result(r))}"
                for r in turn.gate_calls
            )
            lines.append(f"- turn {turn.sequence}: {calls}")
        else:
            lines.append(f"- turn {turn.sequence}: said {_short(turn.content or '')}")
    return "\n".join(lines)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


@attrs.frozen
class FoldingPolicy:
    """When and how to fold an entity's working context."""

    trigger_after_turns: int | None = None
    context_window: int | None = None
    trigger_ratio: float = 0.8
    keep_recent: int = 1
    """Turns kept verbatim after a fold."""
    folder: Folder = attrs.field(default=template_summary, eq=False)

    def should_fold(self, turns_in_view: int, estimated_tokens: int) -> bool:
        if turns_in_view <= self.keep_recent:
            return False
        if self.trigger_after_turns is not None and turns_in_view > self.trigger_after_turns:
            return True
        return (
            self.context_window is not None
            and estimated_tokens > self.trigger_ratio * self.context_window
        )

    def marker(self, first: int, last: int) -> str:
        return f"[Folded: turns {first}-{last}]"
