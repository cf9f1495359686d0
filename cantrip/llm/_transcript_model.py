"""The transcript's vocabulary: provider formats, the completion policy, what a render returns.

Why apart from the renderer: these are the values that cross its boundary --
what a caller chooses (the provider format, the :class:`CompletionPolicy`),
what it gets back (:class:`RenderedTranscript`, its :class:`RenderDiagnostics`)
and what a broken transcript raises (:class:`TranscriptError`) -- read by the
adapters, the debug log and the tests without the rendering engine. The rules
they describe are in :mod:`cantrip.llm._transcript`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from cantrip._errors import InvalidResponseError
from cantrip.llm._contract import Message

ProviderFormat = Literal["openai", "anthropic", "gemini", "mistral", "kimi"]
PROVIDER_FORMATS: tuple[ProviderFormat, ...] = ("openai", "anthropic", "gemini", "mistral", "kimi")
ALTERNATING_FORMATS: frozenset[str] = frozenset({"anthropic", "gemini"})
"""Formats whose roles must alternate: the renderer merges same-role neighbours."""

SyntheticReason = Literal["missing", "interrupted"]
"""Why a call got a synthetic completion.

``interrupted``: the call's assistant message is the last message of the history
(nothing but tool results after it) -- the turn was cut off before the call
returned. ``missing``: the conversation went on without a result for it.
"""

DedupeReason = Literal[
    "duplicate_identical", "duplicate_conflicting", "real_over_synthetic", "synthetic_duplicate"
]


class TranscriptError(InvalidResponseError):
    """A transcript breaks a provider's tool protocol (LLM-7).

    ``problems`` lists every problem found; the message joins them. An orphan
    result reads ``tool result without matching tool call: ...``.
    """

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


@attrs.frozen
class CompletionPolicy:
    """How the renderer completes a call that has no recorded result.

    The synthetic completion is a ``tool`` message with ``is_error`` set and the
    text for its reason. A tool message whose content is one of these texts (and
    whose ``is_error`` matches) counts as synthetic when it appears in the
    input, so a real result recorded later replaces it and rendering a rendered
    transcript again changes nothing.
    """

    missing: str = "[cancelled: no result was recorded for this call]"
    interrupted: str = "[cancelled: the call was interrupted before it returned a result]"
    is_error: bool = True
    opening: str = "[conversation continues]"
    """The user message that opens a history starting with an assistant message,
    for the formats that need a user message first (``anthropic``, ``gemini``)."""

    def text(self, reason: SyntheticReason) -> str:
        return self.interrupted if reason == "interrupted" else self.missing

    def is_synthetic(self, message: Message) -> bool:
        return message.is_error == self.is_error and (
            message.content == self.missing or message.content == self.interrupted
        )


DEFAULT_POLICY = CompletionPolicy()


@attrs.frozen
class SyntheticCompletion:
    """A completion the renderer made up for a call without a recorded result."""

    call_id: str
    """The call's canonical key (see :attr:`RenderedTranscript.id_map`)."""
    projected_id: str
    name: str
    reason: SyntheticReason

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class DedupeDecision:
    """Two completions for one call: which input position was kept, which dropped."""

    call_id: str
    kept: int
    dropped: int
    reason: DedupeReason

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class OrphanResult:
    """A tool message that answers no earlier call; dropped, never emitted (LLM-7)."""

    tool_call_id: str | None
    position: int
    name: str | None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class RenderDiagnostics:
    """What the renderer saw and decided (seed 001, section 10).

    ``canonical_call_ids[i]`` was projected to ``emitted_call_ids[i]``;
    ``emitted_result_ids`` are the ids of the emitted tool messages, in order.
    A renderer pairing fault shows as a difference between the last two; a
    corrupt canonical state as orphans, dedupe decisions or synthetic
    completions; a projection fault in the id lists themselves.
    """

    provider_format: ProviderFormat
    canonical_call_ids: tuple[str, ...]
    emitted_call_ids: tuple[str, ...]
    emitted_result_ids: tuple[str, ...]
    dedupe_decisions: tuple[DedupeDecision, ...]
    synthetic_completions: tuple[SyntheticCompletion, ...]
    dropped_orphan_results: tuple[OrphanResult, ...]
    moved_results: tuple[str, ...] = ()
    """Keys of results moved back next to their call or put into call order."""
    merged_messages: int = 0
    dropped_empty_messages: int = 0
    thinking_dropped: int = 0
    reasoning_dropped: int = 0
    """Reasoning artefacts of another wire format, left out (never shown to this one)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider_format": self.provider_format,
            "canonical_call_ids": list(self.canonical_call_ids),
            "emitted_call_ids": list(self.emitted_call_ids),
            "emitted_result_ids": list(self.emitted_result_ids),
            "dedupe_decisions": [d.to_dict() for d in self.dedupe_decisions],
            "synthetic_completions": [s.to_dict() for s in self.synthetic_completions],
            "dropped_orphan_results": [o.to_dict() for o in self.dropped_orphan_results],
            "moved_results": list(self.moved_results),
            "merged_messages": self.merged_messages,
            "dropped_empty_messages": self.dropped_empty_messages,
            "thinking_dropped": self.thinking_dropped,
            "reasoning_dropped": self.reasoning_dropped,
        }


@attrs.frozen
class RenderedTranscript:
    """A provider-valid transcript, the id projection used, and diagnostics.

    ``id_map`` maps each call's canonical key to its projected id. The key is
    the canonical id; when the same canonical id is used by several calls (some
    models number their calls afresh each turn), the n-th use is keyed
    ``"{id}#{n}"`` (n >= 2).
    """

    messages: tuple[Message, ...]
    id_map: Mapping[str, str]
    diagnostics: RenderDiagnostics


def unknown_format(provider: str) -> ValueError:
    """The error for a provider format the renderer does not know."""
    return ValueError(f"unknown provider format {provider!r}; expected one of {PROVIDER_FORMATS}")
