"""Folding: older turns leave the working context as one marked summary (6.8).

Folding is a view transformation (LOOM-5): the loom keeps every turn, and the
entity's context is re-rendered as ``[system] [current intent] [folded
summary] [recent turns]``. The identity and the gate definitions are never
folded (LOOM-6, IDENTITY-5) -- gate definitions travel in ``tools`` and are
untouched -- and whole turns fold together, so a tool call and its result are
never split (seed 001 section 8); a delegation's checkpoint and continuation
records are one turn of the context and fold as one.

Triggers (D-007): more than ``trigger_after_turns`` turns in view, or the
estimated prompt above ``trigger_ratio`` (default 80 %) of the context window
when one is known -- ``FoldingPolicy.context_window``, else the LLM's own
``context_window`` attribute (see :func:`effective_policy`). Whichever comes
first.

The summary is written by a *folder*:

* a plain function ``(turns) -> str`` runs synchronously inside
  ``Context.add_turn`` -- :func:`template_summary`, the deterministic default;
* an :class:`AsyncFolder` (``async summarize(turns, previous) -> str``, e.g.
  :class:`LLMFolder`) cannot run there without making every append async, so
  the context only *marks* the fold as pending; the entity completes it at the
  start of its next turn (``await Context.complete_fold()``), before the LLM
  is queried. A turn on which no fold triggers never awaits anything.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from cantrip._redact import get_logger
from cantrip.llm._contract import LLM, Message
from cantrip.loom._model import Turn
from cantrip.medium import visible_result

log = get_logger("cantrip.folding")

Folder = Callable[[Sequence[Turn]], str]
"""Writes the summary text for a range of turns, synchronously."""


@runtime_checkable
class AsyncFolder(Protocol):
    """A folder that needs to await (an LLM call, a service).

    ``turns`` are the turns leaving the view by this fold; ``previous`` is the
    summary of the turns folded before them (None on the first fold), so a
    summary can be extended instead of rewritten from the whole history.
    """

    async def summarize(self, turns: Sequence[Turn], previous: str | None) -> str: ...


CHARS_PER_TOKEN = 4
"""The estimate used for the token trigger when no tokenizer is at hand."""

MAX_SUMMARY_LINES = 200
"""The template summary keeps the intents and the last this-many turn lines."""


def template_summary(turns: Sequence[Turn]) -> str:
    """The default folder: one deterministic line per turn (the latest ones when
    there are very many; every intent is always kept)."""
    lines: list[str] = []
    turn_lines: list[str] = []
    for turn in turns:
        if turn.intent is not None:
            lines.append(f"- intent: {turn.intent}")
        turn_lines.append(_turn_line(turn))
    omitted = len(turn_lines) - MAX_SUMMARY_LINES
    if omitted > 0:
        turn_lines = [f"- ({omitted} earlier turns omitted)", *turn_lines[omitted:]]
    return "\n".join([*lines, *turn_lines])


def _turn_line(turn: Turn) -> str:
    if turn.tool_calls and "observations" in turn.extras:  # a code medium: code in, text out
        observation = " ".join(turn.observation.split())
        return f"- turn {turn.sequence}: ran {_short(turn.utterance)} -> {_short(observation)}"
    if turn.gate_calls:
        calls = "; ".join(
            f"{r.gate}({_short(r.arguments)}) -> "
            f"{'ERROR ' if r.is_error else ''}{_short(visible_result(r))}"
            for r in turn.gate_calls
        )
        return f"- turn {turn.sequence}: {calls}"
    return f"- turn {turn.sequence}: said {_short(turn.content or turn.utterance or '')}"


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


FOLD_INSTRUCTIONS = (
    "You compress the history of an agent's work so it can continue with a shorter context. "
    "Write a concise, factual summary of the turns below: what was tried, which tool calls "
    "were made and what they returned, what was learned, and what remains open. Keep exact "
    "values (names, numbers, paths, identifiers) that later work may need. Do not invent "
    "anything and do not address the agent; output only the summary."
)


@attrs.frozen
class LLMFolder:
    """Asks an LLM to write the fold summary (an :class:`AsyncFolder`).

    The LLM is queried without tools. Its answer extends the previous summary
    when there is one. ``max_input_chars`` bounds the transcript sent for
    summarising (the most recent part is kept). If the LLM fails, the context
    falls back to :func:`template_summary` -- folding must still happen.
    Wrap the LLM in ``RetryingLLM`` for retries; the summary query is not a
    turn and is not recorded in the loom (its usage is logged).
    """

    llm: LLM
    instructions: str = FOLD_INSTRUCTIONS
    max_input_chars: int = 60_000

    async def summarize(self, turns: Sequence[Turn], previous: str | None) -> str:
        transcript = "\n\n".join(_turn_text(t) for t in turns)
        if len(transcript) > self.max_input_chars:
            transcript = "...\n" + transcript[-self.max_input_chars :]
        parts = []
        if previous:
            parts.append(f"Summary of the turns before these:\n{previous}")
        parts.append(f"Turns to summarise:\n{transcript}")
        messages = [
            Message(role="system", content=self.instructions),
            Message(role="user", content="\n\n".join(parts)),
        ]
        response = await self.llm.query(messages, (), "none", {})
        log.debug(
            "fold summary of %d turn(s): %d prompt / %d completion tokens",
            len(turns),
            response.usage.prompt_tokens,
            response.usage.completion_tokens,
        )
        text = (response.content or "").strip()
        if not text:
            raise ValueError("the folding LLM returned no summary text")
        return text


def _turn_text(turn: Turn) -> str:
    lines = [f"turn {turn.sequence}:"]
    if turn.intent is not None:
        lines.append(f"  intent: {turn.intent}")
    if turn.content:
        lines.append(f"  said: {turn.content}")
    for call in turn.tool_calls:
        lines.append(f"  called {call.name}({call.arguments_json})")
    for record in turn.gate_calls:
        status = "" if record.status == "ok" else f" [{record.status}]"
        lines.append(
            f"  {record.gate}({json.dumps(dict(record.args), default=str)}) -> "
            f"{visible_result(record)}{status}"
        )
    if turn.observation and not turn.gate_calls:
        lines.append(f"  observation: {turn.observation}")
    return "\n".join(lines)


def is_async_folder(folder: object) -> bool:
    summarize = getattr(folder, "summarize", None)
    return summarize is not None and inspect.iscoroutinefunction(summarize)


@attrs.frozen
class FoldingPolicy:
    """When and how to fold an entity's working context."""

    trigger_after_turns: int | None = None
    context_window: int | None = None
    """Tokens the model can read; None: take the LLM's ``context_window`` if it has one."""
    trigger_ratio: float = 0.8
    keep_recent: int = 1
    """Turns kept verbatim after a fold."""
    folder: Folder | AsyncFolder = attrs.field(default=template_summary, eq=False)

    @property
    def deferred(self) -> bool:
        """Whether the folder must be awaited (the fold completes at the next turn's start)."""
        return is_async_folder(self.folder)

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


def llm_context_window(llm: object) -> int | None:
    """The context window an LLM advertises (an int ``context_window`` attribute), if any."""
    value: Any = getattr(llm, "context_window", None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def effective_policy(policy: FoldingPolicy | None, llm: object) -> FoldingPolicy | None:
    """The policy an entity folds by, with the window filled in from the LLM.

    An explicit ``context_window`` wins. Without one, an LLM that advertises
    its window supplies it -- and PROD-4 then folds at 80 % of it even when the
    cantrip declares no policy at all. Without either, only the turn trigger
    (if any) applies.
    """
    window = llm_context_window(llm)
    if policy is None:
        return FoldingPolicy(context_window=window) if window is not None else None
    if policy.context_window is None and window is not None:
        return attrs.evolve(policy, context_window=window)
    return policy
