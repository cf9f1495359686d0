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
:class:`IncrementalRenderer` keeps the state between turns, so appending a turn
costs O(new messages); its docstring says when it has to render everything again.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, overload

import attrs

from cantrip._errors import InvalidResponseError
from cantrip.llm._contract import Message, ToolCall

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


# --- id projection -------------------------------------------------------------------------

_OPENAI_ID = re.compile(r"call_[A-Za-z0-9_-]+")
_ANTHROPIC_ID = re.compile(r"toolu_[A-Za-z0-9_-]+")
_GEMINI_ID = re.compile(r"[A-Za-z0-9_-]+")
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_KIMI_ID = re.compile(r"functions\.([A-Za-z0-9_-]+):(\d+)")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")
_MAX_LEN: dict[str, int] = {"openai": 40, "anthropic": 64, "gemini": 64}
_PREFIX: dict[str, str] = {"openai": "call_", "anthropic": "toolu_", "gemini": "fc_"}
_NATIVE: dict[str, re.Pattern[str]] = {
    "openai": _OPENAI_ID,
    "anthropic": _ANTHROPIC_ID,
    "gemini": _GEMINI_ID,
    "mistral": _MISTRAL_ID,
}
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def kimi_name(name: str) -> str:
    """The tool name as it appears in a Kimi id: ``[A-Za-z0-9_-]+``."""
    return _UNSAFE_NAME.sub("_", name) or "tool"


def _is_native(candidate: str, provider: str) -> bool:
    pattern = _NATIVE.get(provider)
    if pattern is None or pattern.fullmatch(candidate) is None:
        return False
    return len(candidate) <= _MAX_LEN.get(provider, 9)


def _hashed(seed: str, provider: str, attempt: int) -> str:
    data = seed if attempt == 0 else f"{seed}\x00{attempt}"
    if provider == "mistral":
        number = int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")
        chars = []
        for _ in range(9):
            number, digit = divmod(number, 62)
            chars.append(_BASE62[digit])
        return "".join(chars)
    return _PREFIX[provider] + hashlib.blake2b(data.encode(), digest_size=12).hexdigest()


def project_id(
    canonical_id: str, provider: ProviderFormat, *, index: int, name: str, taken: set[str]
) -> str:
    """The provider id of one call; adds it to ``taken``.

    ``index`` is the call's global position among all calls of the transcript
    (0-based), ``name`` its tool name, ``taken`` the ids already given out in
    this render. Deterministic: the same arguments give the same id.

    * ``kimi``: ``functions.{name}:{index}`` (the name reduced to
      ``[A-Za-z0-9_-]``); the index makes it unique.
    * Otherwise an id already valid for the format is kept as it is (``call_…``
      up to 40 characters for ``openai``; ``toolu_…`` up to 64 for ``anthropic``;
      ``[A-Za-z0-9_-]`` up to 64 for ``gemini``; exactly 9 alphanumerics for
      ``mistral``); any other id becomes the format's prefix plus a BLAKE2b hash
      of it (``call_``/``toolu_``/``fc_`` + 24 hex digits; 9 base-62 digits for
      ``mistral``). An empty id hashes ``index`` and ``name`` instead.
    * When the candidate is already in ``taken`` (a reused canonical id, a
      hash collision) it is hashed again with an attempt counter until free.
    """
    if provider == "kimi":
        base = kimi_name(name)
        candidate = f"functions.{base}:{index}"
        while candidate in taken:  # unreachable within one render: indexes are unique
            index += 1
            candidate = f"functions.{base}:{index}"
        taken.add(candidate)
        return candidate
    if provider not in _NATIVE:
        raise ValueError(
            f"unknown provider format {provider!r}; expected one of {PROVIDER_FORMATS}"
        )
    if canonical_id and _is_native(canonical_id, provider) and canonical_id not in taken:
        taken.add(canonical_id)
        return canonical_id
    seed = canonical_id if canonical_id else f"\x00empty\x00{index}\x00{name}"
    attempt = 0
    candidate = _hashed(seed, provider, attempt)
    while candidate in taken:
        attempt += 1
        candidate = _hashed(seed, provider, attempt)
    taken.add(candidate)
    return candidate


# --- the rendering engine ------------------------------------------------------------------


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


class _Engine:
    """The input scanned once (pass 1), and emission of any suffix of it (pass 2)."""

    def __init__(
        self,
        provider: ProviderFormat,
        policy: CompletionPolicy,
        keep_thinking: bool,
        reasoning_format: str | None = None,
    ):
        if provider not in PROVIDER_FORMATS:
            raise ValueError(
                f"unknown provider format {provider!r}; expected one of {PROVIDER_FORMATS}"
            )
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
    engine = _Engine(provider, policy, keep_thinking, reasoning_format)
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


# --- incremental rendering -----------------------------------------------------------------


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
        self._engine = _Engine(provider, policy, keep_thinking, reasoning_format)
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


# --- validation ----------------------------------------------------------------------------


def _id_problems(call: ToolCall, provider: ProviderFormat, ordinal: int, where: int) -> list[str]:
    cid = call.id
    if not cid:
        return [f"message {where}: tool call to {call.name!r} has an empty id"]
    if provider == "kimi":
        match = _KIMI_ID.fullmatch(cid)
        if match is None:
            return [f"message {where}: kimi tool call id {cid!r} is not functions.<name>:<index>"]
        problems = []
        if match.group(1) != kimi_name(call.name):
            problems.append(
                f"message {where}: kimi tool call id {cid!r} names "
                f"{match.group(1)!r}, the call is to {call.name!r}"
            )
        if int(match.group(2)) != ordinal:
            problems.append(
                f"message {where}: kimi tool call id {cid!r} has index {match.group(2)}, "
                f"expected the global call index {ordinal}"
            )
        return problems
    if _is_native(cid, provider):
        return []
    rules = {
        "openai": "call_ followed by [A-Za-z0-9_-], at most 40 characters",
        "anthropic": "toolu_ followed by [A-Za-z0-9_-], at most 64 characters",
        "gemini": "[A-Za-z0-9_-], at most 64 characters",
        "mistral": "exactly 9 letters or digits",
    }
    return [f"message {where}: {provider} tool call id {cid!r} is not {rules[provider]}"]


def _reasoning_problems(message: Message, where: int, accepted: str | None) -> list[str]:
    if message.role != "assistant":
        return [f"message {where}: a {message.role} message carries reasoning artefacts"]
    problems: list[str] = []
    last = len(message.tool_calls)
    for part in message.reasoning:
        if part.format != accepted:
            problems.append(
                f"message {where}: a reasoning artefact of {part.format!r} is sent to "
                f"{accepted or 'a format that takes none'}"
            )
        if part.kind == "part" and not 0 <= part.position <= last + 1:
            problems.append(f"message {where}: reasoning part at position {part.position}")
        elif part.kind == "fields" and not (
            (part.position == 0 and message.content) or 1 <= part.position <= last
        ):
            problems.append(
                f"message {where}: reasoning fields for part {part.position}, which it lacks"
            )
    return problems


def validate_transcript(
    messages: Sequence[Message],
    provider: ProviderFormat,
    *,
    strict: bool = False,
    reasoning_format: str | None = None,
) -> list[str]:
    """Every way ``messages`` break ``provider``'s tool protocol; ``[]`` when valid.

    Checked for every format: each assistant tool call is answered by exactly
    one tool message in the block of tool messages right after it, in call
    order; no tool message stands anywhere else or answers an unknown id
    (``tool result without matching tool call``, LLM-7); call ids are non-empty,
    unique in the transcript and in the format's id syntax (Kimi: the tool name
    and the global call index); an assistant message has content or tool calls.
    ``gemini`` and ``mistral`` also need a tool message to name its call's tool.
    ``anthropic`` and ``gemini`` also need alternating roles: no two user or two
    assistant messages in a row, system messages only before the first other
    message, and a user message first (a tool block followed by a user message
    is fine: one user turn on the wire).

    Reasoning artefacts may only ride on assistant messages, only in
    ``reasoning_format`` (``None``: none at all), and only at a position the
    message has (a ``fields`` artefact needs the part it is set on).

    With ``strict=True`` problems raise a :class:`TranscriptError` instead.
    """
    if provider not in PROVIDER_FORMATS:
        raise ValueError(
            f"unknown provider format {provider!r}; expected one of {PROVIDER_FORMATS}"
        )
    problems: list[str] = []
    alternating = provider in ALTERNATING_FORMATS
    names_needed = provider in ("gemini", "mistral")
    seen: dict[str, int] = {}
    ordinal = 0
    started = False
    previous: str | None = None
    count = len(messages)
    i = 0
    while i < count:
        message = messages[i]
        role = message.role
        if message.reasoning:
            problems.extend(_reasoning_problems(message, i, reasoning_format))
        if role == "system":
            if alternating and started:
                problems.append(
                    f"message {i}: system message after the conversation started "
                    f"({provider} takes system instructions only up front)"
                )
            i += 1
            continue
        if role == "tool":
            problems.append(
                f"message {i}: tool result without matching tool call: "
                f"{message.tool_call_id!r} does not follow the assistant message "
                "that made the call (LLM-7)"
            )
            started = True
            previous = "tool"
            i += 1
            continue
        if role not in ("user", "assistant"):
            problems.append(f"message {i}: unknown role {role!r}")
        if alternating:
            if not started and role != "user":
                problems.append(
                    f"message {i}: {provider} needs a user message before the first {role} message"
                )
            if previous == role:
                problems.append(
                    f"message {i}: two {role} messages in a row "
                    f"({provider} needs alternating roles)"
                )
        started = True
        previous = role
        if role != "assistant":
            i += 1
            continue
        calls = message.tool_calls
        if not message.content and not calls:
            problems.append(f"message {i}: assistant message with neither content nor tool calls")
        order: dict[str, int] = {}
        for position, call in enumerate(calls):
            problems.extend(_id_problems(call, provider, ordinal, i))
            ordinal += 1
            if call.id in seen:
                problems.append(
                    f"message {i}: tool call id {call.id!r} is already used by message "
                    f"{seen[call.id]} (ids must be unique)"
                )
            else:
                seen[call.id] = i
            order.setdefault(call.id, position)
        j = i + 1
        answered: set[str] = set()
        highest = -1
        while j < count and messages[j].role == "tool":
            result = messages[j]
            tid = result.tool_call_id
            if tid is None or tid not in order:
                problems.append(
                    f"message {j}: tool result without matching tool call: {tid!r} answers "
                    f"no call of the preceding assistant message {i} (LLM-7)"
                )
            elif tid in answered:
                problems.append(
                    f"message {j}: a second tool result for call {tid!r} "
                    "(at most one completion per call)"
                )
            else:
                answered.add(tid)
                position = order[tid]
                if position < highest:
                    problems.append(f"message {j}: tool result for {tid!r} is out of call order")
                highest = max(highest, position)
                if names_needed and result.name != calls[position].name:
                    problems.append(
                        f"message {j}: tool result for {tid!r} names {result.name!r}, "
                        f"the call is to {calls[position].name!r}"
                    )
            j += 1
        for call in calls:
            if call.id not in answered:
                problems.append(
                    f"message {i}: tool call {call.id!r} ({call.name}) has no tool result "
                    "right after the assistant message"
                )
        if j > i + 1:
            previous = "tool"
        i = j
    if strict and problems:
        raise TranscriptError(problems)
    return problems
