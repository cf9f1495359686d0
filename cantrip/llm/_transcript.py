"""Tool-interaction integrity: canonical history rendered as a provider-valid transcript.

Seed 001 separates three layers: the canonical history (what the loom recorded,
provider-neutral), this *transcript renderer*, and the provider adapters that
turn the rendered transcript into wire payloads. The renderer owns interaction
validity; an adapter owns syntax and shape and never has to repair pairing.

:func:`render_transcript` takes canonical :class:`Message` values and returns
canonical ``Message`` values again (roles ``system``/``user``/``assistant``/
``tool``) that satisfy the target provider's tool protocol:

1. **Pairing.** Every assistant tool call is answered by exactly one ``tool``
   message. A call without a recorded result gets a *synthetic completion*
   (``is_error=True``), see :class:`CompletionPolicy`.
2. **Placement.** The answers follow the assistant message that made the calls
   immediately, in call order, before any other message. A result recorded
   later in the canonical list (after other messages) is moved back there; a
   block recorded out of order is put in call order.
3. **Dedupe.** At most one completion per call: the first real result wins; a
   real result replaces a synthetic one recorded earlier (the policy's texts
   recognise those); every decision is reported in the diagnostics.
4. **Orphans.** A ``tool`` message that answers no call made earlier in the
   list is dropped and reported, never emitted (LLM-7).
5. **Ids.** Every call id is projected into the provider's format by
   :func:`project_id`; the call and its answer always carry the same projected
   id, and distinct calls never share one (injective within a render).
6. **Thinking** stays on the assistant message beside its tool calls;
   ``keep_thinking=False`` (for a provider that cannot accept another
   provider's reasoning) removes it without touching pairing. **Reasoning
   artefacts** (:class:`~cantrip.llm.ReasoningPart`) stay only when their
   ``format`` is the target's ``reasoning_format`` (the adapter replays them
   byte for byte, in place); every other one is dropped and counted in
   ``reasoning_dropped``, so another provider never sees them. When two
   assistant messages are merged (rule 7) the merged message keeps the
   artefacts of the later one only: their positions still name its parts.
7. **Alternation** (``anthropic`` and ``gemini`` only): consecutive ``user``
   messages are merged into one (contents joined by a blank line), and so are
   consecutive ``assistant`` messages (the first has no tool calls, else its
   results would stand between them); a ``system`` message after the first
   non-system message becomes a ``user`` message (both APIs take system
   instructions only up front); a conversation whose first non-system message
   is an assistant message is opened by :attr:`CompletionPolicy.opening` as a
   user message. A tool block followed by a user message stays as it is: the
   adapter sends both as one user turn, tool results first. ``openai``,
   ``mistral`` and ``kimi`` get no merging.

An assistant message with neither content nor tool calls is dropped (it can
carry thinking only, which no provider accepts on its own).

The renderer is pure (no I/O, no clock, no randomness) and costs O(messages).
:class:`~cantrip.llm._transcript_incremental.IncrementalRenderer` keeps its
engine's state between turns, so appending a turn costs O(new messages); its
docstring says when it has to render everything again.

This module is the engine and :func:`render_transcript`; beside it are the
renderer's vocabulary (:mod:`cantrip.llm._transcript_model`: formats, policy,
diagnostics), the id rules (:mod:`cantrip.llm._transcript_ids`) and the
independent check of a rendered transcript (:mod:`cantrip.llm._transcript_check`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import MappingProxyType

import attrs

from cantrip.llm._contract import Message, ToolCall
from cantrip.llm._transcript_check import validate_transcript
from cantrip.llm._transcript_ids import project_id
from cantrip.llm._transcript_model import (
    ALTERNATING_FORMATS,
    DEFAULT_POLICY,
    PROVIDER_FORMATS,
    CompletionPolicy,
    DedupeDecision,
    OrphanResult,
    ProviderFormat,
    RenderDiagnostics,
    RenderedTranscript,
    SyntheticCompletion,
    SyntheticReason,
    TranscriptError,
    unknown_format,
)


class _Group:
    """One assistant message of the input and its calls."""

    __slots__ = ("entry", "max_answered", "rendered", "slots")

    def __init__(self, entry: int) -> None:
        self.entry = entry
        self.rendered: Message | None = None
        self.slots: list[_Slot] = []
        self.max_answered = -1


class _Slot:
    """One call and the completion chosen for it so far."""

    __slots__ = ("call", "group", "key", "order", "projected", "rendered", "result", "synthetic")

    def __init__(self, group: _Group, call: ToolCall, key: str, projected: str, order: int) -> None:
        self.group = group
        self.call = call
        self.key = key
        self.projected = projected
        self.order = order
        self.result = -1
        """Input position of the chosen completion; -1 while there is none."""
        self.synthetic = False
        """Whether the chosen completion is itself a synthetic one from the input."""
        self.rendered: Message | None = None


_Entry = Message | _Group


@attrs.define
class _Emission:
    messages: list[Message]
    entry_pos: list[int]
    """Output index at which each emitted entry's messages begin."""
    entry_started: list[bool]
    run_start: list[int]
    """For each output message, the entry index its message began with (-1: tool)."""
    group_run: dict[int, int]
    """Entry index of a group -> the entry its assistant message began with."""
    started: bool
    synthetic: list[SyntheticCompletion]
    merged: int
    dropped: int


def _join(first: str | None, second: str | None) -> str | None:
    if not first:
        return second
    if not second:
        return first
    return f"{first}\n\n{second}"


class RenderEngine:
    """The input scanned once (pass 1), and emission of any suffix of it (pass 2)."""

    def __init__(
        self,
        provider: ProviderFormat,
        policy: CompletionPolicy,
        keep_thinking: bool,
        reasoning_format: str | None = None,
    ):
        if provider not in PROVIDER_FORMATS:
            raise unknown_format(provider)
        self.provider: ProviderFormat = provider
        self.policy = policy
        self.keep_thinking = keep_thinking
        self.reasoning_format = reasoning_format
        self.alternating = provider in ALTERNATING_FORMATS
        self.entries: list[_Entry] = []
        self.slots: list[_Slot] = []
        self.by_id: dict[str, list[_Slot]] = {}
        """Canonical id -> the calls with that id in the latest assistant message using it."""
        self.uses: dict[str, int] = {}
        self.taken: set[str] = set()
        self.id_map: dict[str, str] = {}
        self.remapped = False
        """Whether some key of :attr:`id_map` maps to another id (a projected or reused id)."""
        self.orphans: list[OrphanResult] = []
        self.dedupe: list[DedupeDecision] = []
        self.moved: list[str] = []
        self.last_group: _Group | None = None
        self.position = 0
        self.thinking_dropped = 0
        self.reasoning_dropped = 0

    # pass 1 ---------------------------------------------------------------------------------

    def ingest(self, message: Message) -> _Group | None:
        """Take the next input message; return the group whose rendering it changed."""
        position = self.position
        self.position += 1
        role = message.role
        if role == "tool":
            return self._result(message, position)
        if role == "assistant":
            self._assistant(message)
        else:
            self.entries.append(message)
        return None

    def _assistant(self, message: Message) -> None:
        group = _Group(len(self.entries))
        calls: list[ToolCall] = []
        same = True
        in_group: dict[str, list[_Slot]] = {}
        for order, call in enumerate(message.tool_calls):
            cid = call.id or ""
            uses = self.uses.get(cid, 0) + 1
            self.uses[cid] = uses
            key = cid if uses == 1 else f"{cid}#{uses}"
            projected = project_id(
                cid, self.provider, index=len(self.slots), name=call.name, taken=self.taken
            )
            self.id_map[key] = projected
            if key != projected:
                self.remapped = True
            slot = _Slot(group, call, key, projected, order)
            group.slots.append(slot)
            self.slots.append(slot)
            in_group.setdefault(cid, []).append(slot)
            if projected == call.id:
                calls.append(call)
            else:
                same = False
                calls.append(attrs.evolve(call, id=projected))
        self.by_id.update(in_group)
        thinking = message.thinking
        if thinking is not None and not self.keep_thinking:
            self.thinking_dropped += 1
            thinking = None
            same = False
        reasoning = message.reasoning
        if reasoning:
            kept = tuple(r for r in reasoning if r.format == self.reasoning_format)
            if len(kept) != len(reasoning):
                self.reasoning_dropped += len(reasoning) - len(kept)
                reasoning = kept
                same = False
        if message.content or calls:
            group.rendered = (
                message
                if same
                else Message(
                    role="assistant",
                    content=message.content,
                    tool_calls=tuple(calls),
                    name=message.name,
                    thinking=thinking,
                    reasoning=reasoning,
                )
            )
        self.entries.append(group)
        self.last_group = group

    def _result(self, message: Message, position: int) -> _Group | None:
        candidates = self.by_id.get(message.tool_call_id or "")
        if candidates is None:
            self.orphans.append(OrphanResult(message.tool_call_id, position, message.name))
            return None
        synthetic = self.policy.is_synthetic(message)
        for slot in candidates:
            if slot.result < 0:
                self._assign(slot, message, position, synthetic)
                return slot.group
        if not synthetic:
            for slot in candidates:
                if slot.synthetic:
                    self.dedupe.append(
                        DedupeDecision(slot.key, position, slot.result, "real_over_synthetic")
                    )
                    self._assign(slot, message, position, False)
                    return slot.group
            for slot in candidates:
                kept = slot.rendered
                if (
                    kept is not None
                    and kept.content == (message.content or "")
                    and kept.is_error == message.is_error
                ):
                    self.dedupe.append(
                        DedupeDecision(slot.key, slot.result, position, "duplicate_identical")
                    )
                    return None
            first = candidates[0]
            self.dedupe.append(
                DedupeDecision(first.key, first.result, position, "duplicate_conflicting")
            )
            return None
        first = candidates[0]
        self.dedupe.append(DedupeDecision(first.key, first.result, position, "synthetic_duplicate"))
        return None

    def _assign(self, slot: _Slot, message: Message, position: int, synthetic: bool) -> None:
        group = slot.group
        if not synthetic and (self.entries[-1] is not group or slot.order < group.max_answered):
            self.moved.append(slot.key)
        group.max_answered = max(group.max_answered, slot.order)
        slot.result = position
        slot.synthetic = synthetic
        if (
            message.content is not None
            and message.tool_call_id == slot.projected
            and message.name == slot.call.name
            and not message.tool_calls
            and message.thinking is None
            and not message.reasoning
        ):
            slot.rendered = message  # already what it would be rendered as (the usual case)
            return
        slot.rendered = Message(
            role="tool",
            content=message.content if message.content is not None else "",
            tool_call_id=slot.projected,
            name=slot.call.name,
            is_error=message.is_error,
        )

    # pass 2 ---------------------------------------------------------------------------------

    def emit(self, start: int, started: bool) -> _Emission:
        """The messages of entries ``start..`` (``started``: a non-system message came before).

        ``start`` must be the first entry of an output message (a run start), so
        nothing emitted here merges into what came before.
        """
        entries = self.entries
        policy = self.policy
        alternating = self.alternating
        last = len(entries) - 1
        out: list[Message] = []
        run_start: list[int] = []
        entry_pos: list[int] = []
        entry_started: list[bool] = []
        group_run: dict[int, int] = {}
        synthetic: list[SyntheticCompletion] = []
        merged = dropped = 0
        for i in range(start, len(entries)):
            entry = entries[i]
            entry_pos.append(len(out))
            entry_started.append(started)
            if isinstance(entry, _Group):
                message = entry.rendered
                if message is None:
                    dropped += 1
                    continue
                if not alternating:
                    out.append(message)
                    run_start.append(i)
                    group_run[i] = i
                elif not started:
                    started = True
                    out.append(Message(role="user", content=policy.opening))
                    run_start.append(i)
                    out.append(message)
                    run_start.append(i)
                    group_run[i] = i
                elif out and out[-1].role == "assistant" and not out[-1].tool_calls:
                    previous = out[-1]
                    out[-1] = Message(
                        role="assistant",
                        content=_join(previous.content, message.content),
                        tool_calls=message.tool_calls,
                        name=previous.name,
                        thinking=_join(previous.thinking, message.thinking),
                        reasoning=message.reasoning,
                    )
                    merged += 1
                    group_run[i] = run_start[-1]
                else:
                    out.append(message)
                    run_start.append(i)
                    group_run[i] = i
                if entry.slots:
                    reason: SyntheticReason = "interrupted" if i == last else "missing"
                    for slot in entry.slots:
                        result = slot.rendered
                        if result is None:
                            result = Message(
                                role="tool",
                                content=policy.text(reason),
                                tool_call_id=slot.projected,
                                name=slot.call.name,
                                is_error=policy.is_error,
                            )
                            synthetic.append(
                                SyntheticCompletion(
                                    slot.key, slot.projected, slot.call.name, reason
                                )
                            )
                        out.append(result)
                        run_start.append(-1)
                continue
            if entry.role == "system" and not (alternating and started):
                out.append(entry)
                run_start.append(i)
                continue
            if not alternating:
                out.append(entry)
                run_start.append(i)
                continue
            started = True
            if entry.role != "user":
                entry = Message(role="user", content=entry.content, name=entry.name)
            if out and out[-1].role == "user":
                previous = out[-1]
                out[-1] = Message(
                    role="user", content=_join(previous.content, entry.content), name=previous.name
                )
                merged += 1
            else:
                out.append(entry)
                run_start.append(i)
        return _Emission(
            out, entry_pos, entry_started, run_start, group_run, started, synthetic, merged, dropped
        )

    def open_from(self, emission: _Emission, start: int) -> int:
        """The first entry whose output a later append may still change.

        That is the assistant message of the latest group while one of its calls
        has no real result yet, and (alternating formats) the last output
        message when the next message could merge into it.
        """
        cut = len(self.entries)
        group = self.last_group
        if (
            group is not None
            and group.entry >= start
            and group.entry in emission.group_run
            and any(slot.result < 0 or slot.synthetic for slot in group.slots)
        ):
            cut = emission.group_run[group.entry]
        if self.alternating and emission.messages:
            tail = emission.messages[-1]
            if tail.role == "user" or (tail.role == "assistant" and not tail.tool_calls):
                cut = min(cut, emission.run_start[-1])
        return cut

    def diagnostics(self, messages: Iterable[Message], emission: _Emission) -> RenderDiagnostics:
        return RenderDiagnostics(
            provider_format=self.provider,
            canonical_call_ids=tuple(slot.call.id or "" for slot in self.slots),
            emitted_call_ids=tuple(slot.projected for slot in self.slots),
            emitted_result_ids=tuple(m.tool_call_id or "" for m in messages if m.role == "tool"),
            dedupe_decisions=tuple(self.dedupe),
            synthetic_completions=tuple(emission.synthetic),
            dropped_orphan_results=tuple(self.orphans),
            moved_results=tuple(self.moved),
            merged_messages=emission.merged,
            dropped_empty_messages=emission.dropped,
            thinking_dropped=self.thinking_dropped,
            reasoning_dropped=self.reasoning_dropped,
        )


def render_transcript(
    messages: Sequence[Message],
    provider: ProviderFormat,
    *,
    policy: CompletionPolicy = DEFAULT_POLICY,
    keep_thinking: bool = True,
    reasoning_format: str | None = None,
    debug: bool = False,
) -> RenderedTranscript:
    """Render canonical history as a transcript valid for ``provider`` (see the module doc).

    With ``debug=True`` the result is checked with :func:`validate_transcript`
    and a :class:`TranscriptError` carrying the diagnostics is raised if the
    renderer produced anything invalid (a renderer bug, never an input problem).
    ``reasoning_format`` names the reasoning artefacts the target accepts (the
    adapter's ``api_format``); ``None`` drops them all.
    """
    engine = RenderEngine(provider, policy, keep_thinking, reasoning_format)
    for message in messages:
        engine.ingest(message)
    emission = engine.emit(0, False)
    rendered = tuple(emission.messages)
    result = RenderedTranscript(
        rendered, MappingProxyType(dict(engine.id_map)), engine.diagnostics(rendered, emission)
    )
    if debug:
        problems = validate_transcript(rendered, provider, reasoning_format=reasoning_format)
        if problems:
            raise TranscriptError(
                [*problems, f"renderer diagnostics: {result.diagnostics.to_dict()!r}"]
            )
    return result
