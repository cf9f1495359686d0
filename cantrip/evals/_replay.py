"""Replay: an LLM that answers from a recorded loom, keyed by the conversation.

A recorded cast holds, turn by turn, what the model answered to the conversation it
was shown. :class:`ReplayLLM` indexes every such answer by that conversation --
the system prompt, the intents, every earlier utterance and observation, rendered
the way the entity renders its context -- and answers a request with the response
recorded for the same conversation. Not by position: concurrent cases, repeats and
children find their answers alike, offline and deterministic, with no key and no
network.

A request the recording never saw is a *divergence*: the agent was changed (its
prompt, a gate, the order of its calls) so that it asks something new. The replay
raises :class:`ReplayDivergence` naming the turn and the first message that differs
from the closest recorded conversation; the eval reports the case failed.

What the key holds, and why: messages' roles, text, tool calls (gate and
arguments), and results. Tool-call ids are replaced by their order of appearance
(providers and runs mint their own), and reasoning artefacts are left out (opaque,
provider-shaped, and never what the agent decides on). The tools offered are not
in the key: a recorded answer stays a valid answer to the same conversation when a
gate is added; a removed or renamed gate diverges at the turn whose answer calls it
(the call fails, so the next request differs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import orjson

from cantrip._context import Context, ObservationRenderer, recorded_memory
from cantrip._errors import LLMError
from cantrip._medium_names import resolve_medium_name
from cantrip.llm._contract import Message, Response, ToolCall, ToolChoice, ToolDefinition, Usage
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._view import CHECKPOINT_PHASES

_CONTINUATIONS = frozenset({"continuation", "continuation+checkpoint"})

Key = tuple[tuple[Any, ...], ...]
"""A conversation, normalized: one tuple per message."""


class ReplayDivergence(LLMError):
    """The agent asked something the recording never saw."""

    def __init__(self, turn: int, difference: str) -> None:
        self.turn = turn
        self.difference = difference
        super().__init__(f"replay diverged at turn {turn}: {difference}")


def conversation_key(messages: Sequence[Message]) -> Key:
    """The conversation ``messages`` hold, without what differs between runs."""
    ids: dict[str, int] = {}

    def ordinal(call_id: str | None) -> int | None:
        if call_id is None:
            return None
        return ids.setdefault(call_id, len(ids))

    out: list[tuple[Any, ...]] = []
    for message in messages:
        calls = tuple(
            (ordinal(call.id), call.name, call.arguments_json) for call in message.tool_calls
        )
        out.append(
            (
                message.role,
                message.content or "",
                calls,
                ordinal(message.tool_call_id),
                message.name,
                message.is_error,
            )
        )
    return tuple(out)


def _response_of(turn: Turn) -> Response:
    """What the model answered in ``turn``, as the LLM contract returns it."""
    meta = turn.metadata
    return Response(
        content=turn.content,
        tool_calls=turn.tool_calls,
        usage=Usage(
            meta.tokens_prompt,
            meta.tokens_completion,
            meta.tokens_cached,
            meta.tokens_cache_write,
            meta.tokens_reasoning,
        ),
        thinking=turn.thinking,
        model=meta.model,
        provider=meta.provider,
        reasoning=turn.reasoning,
        stop_reason="tool_use" if turn.tool_calls else "end_turn",
        # what the answer cost when it was recorded: a replay reports it, as a
        # provider that reports its costs does (ReplayLLM.reports_cost)
        metadata={} if meta.cost_usd is None else {"cost": meta.cost_usd},
    )


def _answered(turn: Turn) -> bool:
    """Whether ``turn`` records a model's answer (not a delegation's or pause's
    continuation, which carries the rest of an earlier answer)."""
    if turn.extras.get("phase") in _CONTINUATIONS:
        return False
    return bool(turn.content or turn.tool_calls)


@attrs.frozen
class _Recorded:
    key: Key
    response: Response


class ReplayIndex:
    """Every recorded answer of a loom, by the conversation that preceded it."""

    def __init__(self) -> None:
        self._answers: dict[Key, Response] = {}
        self._by_length: dict[int, list[Key]] = {}

    def __len__(self) -> int:
        return len(self._answers)

    def add(self, key: Key, response: Response) -> None:
        if key not in self._answers:
            self._answers[key] = response
            self._by_length.setdefault(len(key), []).append(key)

    def get(self, key: Key) -> Response | None:
        return self._answers.get(key)

    def closest(self, key: Key) -> Key | None:
        """The recorded conversation sharing the longest prefix with ``key``."""
        best: Key | None = None
        best_shared = -1
        for candidates in self._by_length.values():
            for candidate in candidates:
                shared = _shared_prefix(candidate, key)
                if shared > best_shared or (
                    shared == best_shared and best is not None and len(candidate) < len(best)
                ):
                    best, best_shared = candidate, shared
        return best

    @classmethod
    def from_loom(
        cls, loom: Loom, mediums: Mapping[str, ObservationRenderer] | None = None
    ) -> ReplayIndex:
        """Index every entity's answers in ``loom``.

        ``mediums`` renders observations by the medium name the entity records
        carry (the eval's own medium first); other names are resolved from the
        registry of mediums spec files may name.
        """
        index = cls()
        known: dict[str, ObservationRenderer] = dict(mediums or {})
        for entity_id, record in loom.entities.items():
            medium = known.get(record.medium)
            if medium is None:
                medium = known[record.medium] = resolve_medium_name(record.medium)
            system = record.identity.get("system_prompt")
            for thread in _threads(loom.entity_turns(entity_id)):
                index._add_thread(thread, system, medium)
        return index

    def _add_thread(
        self, thread: Iterable[Turn], system: str | None, medium: ObservationRenderer
    ) -> None:
        context = Context(system, medium)
        for turn in thread:
            if _answered(turn):
                if turn.intent is not None:
                    context.add_intent(turn.intent)
                    added = recorded_memory(turn)  # the prompt memory made (issue 42)
                    if added:
                        context.add_memory(added)
                self.add(conversation_key(context.snapshot()), _response_of(turn))
            context.add_turn(turn)


def _threads(turns: Sequence[Turn]) -> list[list[Turn]]:
    """Each root-to-leaf path through one entity's turns (forks make several)."""
    by_id = {turn.id: turn for turn in turns}
    has_child = {turn.parent_id for turn in turns if turn.parent_id in by_id}
    threads: list[list[Turn]] = []
    for leaf in turns:
        if leaf.id in has_child:
            continue
        path: list[Turn] = []
        node: Turn | None = leaf
        while node is not None:
            path.append(node)
            node = by_id.get(node.parent_id) if node.parent_id is not None else None
        path.reverse()
        # a checkpoint still open at the leaf has no continuation yet: nothing lost,
        # the answer it records is indexed like any other
        threads.append(path)
    return threads


def _shared_prefix(a: Key, b: Key) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _describe(message: tuple[Any, ...] | None) -> str:
    if message is None:
        return "nothing"
    role, content, calls, _, name, is_error = message
    parts = [role]
    if name:
        parts.append(f"from {name}")
    if is_error:
        parts.append("(error)")
    text = content if len(content) <= 120 else content[:117] + "..."
    described = " ".join(parts) + (f" {text!r}" if content else "")
    if calls:
        described += " calling " + ", ".join(
            f"{gate}({args if len(args) <= 80 else args[:77] + '...'})" for _, gate, args in calls
        )
    return described


def divergence(index: ReplayIndex, key: Key) -> ReplayDivergence:
    """Why ``key`` has no recorded answer, said against the closest recording."""
    turn = 1 + sum(1 for message in key if message[0] == "assistant")
    closest = index.closest(key)
    if closest is None:
        return ReplayDivergence(turn, "the recording holds no answers")
    shared = _shared_prefix(closest, key)
    asked = key[shared] if shared < len(key) else None
    recorded = closest[shared] if shared < len(closest) else None
    return ReplayDivergence(
        turn,
        f"message {shared + 1} of the request is {_describe(asked)}; "
        f"the closest recording has {_describe(recorded)}",
    )


class ReplayLLM:
    """An :class:`~cantrip.LLM` that answers from a :class:`ReplayIndex`.

    Stateless, so one instance serves any number of concurrent casts.
    """

    reports_cost = True
    """Each answer carries the cost it was recorded at, so a spec's ``max_cost_usd``
    ward replays as it ran instead of refusing an LLM that has no price of its own."""

    def __init__(self, index: ReplayIndex, name: str = "replay") -> None:
        self._index = index
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        key = conversation_key(messages)
        response = self._index.get(key)
        if response is None:
            raise divergence(self._index, key)
        offered = {tool.name for tool in tools}
        missing = [
            call.name for call in response.tool_calls if offered and call.name not in offered
        ]
        if missing:
            turn = 1 + sum(1 for message in key if message[0] == "assistant")
            raise ReplayDivergence(
                turn,
                f"the recorded answer calls {', '.join(sorted(set(missing)))}, "
                "which this circle no longer offers",
            )
        return response


def recorded_calls(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    """Tool calls as plain data (for reports)."""
    return [{"gate": c.name, "args": orjson.loads(c.arguments_json)} for c in calls]


__all__ = [
    "CHECKPOINT_PHASES",
    "ReplayDivergence",
    "ReplayIndex",
    "ReplayLLM",
    "conversation_key",
    "divergence",
]
