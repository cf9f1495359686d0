"""The expectations of a case: each key of ``expect`` reads the world it ran in.

A key is a method ``_x_<key>`` of :class:`Expectations` or one of the patterned
keys (``turn_N_observation``, ``thread_N``, ``<llm>_invocations``); any other
key fails the case. Every check says what it compared and where.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cantrip.conformance._checks import (
    check_error,
    check_query,
    check_stateless,
    check_thread_steps,
    check_usage,
    rendered_steps,
)
from cantrip.conformance._matchers import (
    LabelBinding,
    Mismatch,
    check_value,
    parse_reference,
    require_keys,
)
from cantrip.conformance._world import MAIN_LLM, World, turn_at
from cantrip.llm._contract import Query
from cantrip.llm._scripted import ScriptedLLM
from cantrip.loom._model import Turn
from gates.fixtures import call_count


class Expectations:
    """Checks an ``expect`` mapping against a world."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.labels = LabelBinding()

    def check(self, expect: dict[str, Any]) -> None:
        error = self.world.error
        if "error" in expect:
            check_error(error, expect.pop("error"))
        elif error is not None:
            raise Mismatch(f"unexpected error: {type(error).__name__}: {error}")
        for key, value in expect.items():
            self._one(key, value)

    def _one(self, key: str, value: Any) -> None:
        handler = getattr(self, f"_x_{key}", None)
        if handler is not None:
            handler(value)
            return
        if key.startswith("turn_") and key.endswith("_observation"):
            self._turn_observation(int(key.split("_")[1]), value, key)
        elif key.startswith("thread_") and key[7:].isdigit():
            self._thread_n(int(key[7:]), value, key)
        elif key.endswith("_invocations") and key.removesuffix("_invocations") in self.world.llms:
            self._invocations(key.removesuffix("_invocations"), value, key)
        else:
            raise Mismatch(f"expect: unknown key {key!r} -- not part of the schema")

    # -- casts -----------------------------------------------------------------

    def _x_result(self, value: Any) -> None:
        check_value(self.world.last.result, value, "result")

    def _x_result_contains(self, value: Any) -> None:
        text = self.world.last.text
        if str(value) not in text:
            raise Mismatch(f"result_contains: {value!r} not in {text!r}")

    def _x_results(self, value: Any) -> None:
        check_value([c.result for c in self.world.casts], value, "results")

    def _x_terminated(self, value: Any) -> None:
        check_value(self.world.last.terminated, value, "terminated")

    def _x_truncated(self, value: Any) -> None:
        check_value(self.world.last.truncated, value, "truncated")

    def _x_turns(self, value: Any) -> None:
        check_value(len(self.world.last.turns), value, "turns")

    def _x_entities(self, value: Any) -> None:
        check_value(len(self.world.loom.entities), value, "entities")

    def _x_entity_ids_unique(self, value: Any) -> None:
        ids = [c.entity_id for c in self.world.casts]
        if len(ids) < 2:
            raise Mismatch(
                f"entity_ids_unique: needs at least two casts to compare, the case made {len(ids)}"
            )
        check_value(len(set(ids)) == len(ids), value, "entity_ids_unique")

    def _executed(self) -> list[Any]:
        return [r for t in self.world.last.turns for r in t.gate_calls if r.executed]

    def _x_gate_calls_executed(self, value: Any) -> None:
        """Which gates ran, as a multiset: every name as often as it ran, in any order."""
        if not isinstance(value, list):
            raise Mismatch(f"gate_calls_executed takes a list of gate names, not {value!r}")
        ran = [r.gate for r in self._executed()]
        if sorted(ran) != sorted(str(v) for v in value):
            raise Mismatch(f"gate_calls_executed: expected {sorted(value)} (any order), ran {ran}")

    def _x_gate_call_order(self, value: Any) -> None:
        """Which gates ran, in the order they ran."""
        check_value([r.gate for r in self._executed()], value, "gate_call_order")

    def _x_gate_results(self, value: Any) -> None:
        check_value([r.result for r in self._executed()], value, "gate_results")

    def _x_usage(self, value: Any) -> None:
        """The last cast's own usage, as the cast reports it."""
        check_usage(self.world.last.usage.to_dict(), value, "usage")

    def _x_cumulative_usage(self, value: Any) -> None:
        """The last cast's entity's running total: the sum over every turn the loom
        records for that entity (PROD-3), read from the loom, not from the cast."""
        entity_id = self.world.last.entity_id
        usage = sum(
            (t.metadata.usage for t in self.world.loom.entity_turns(entity_id)),
            start=self.world.last.usage.__class__(),
        ).to_dict()
        check_usage(usage, value, "cumulative_usage")

    def _turn_observation(self, sequence: int, value: Mapping[str, Any], where: str) -> None:
        turns = self.world.loom.entity_turns(self.world.last.entity_id)
        match = [t for t in turns if t.sequence == sequence]
        if not match:
            raise Mismatch(f"{where}: the entity has no turn {sequence}")
        turn = match[0]
        require_keys(value, ("is_error", "content", "content_contains"), where)
        if "is_error" in value:
            check_value(turn.is_error, value["is_error"], f"{where}.is_error")
        if "content" in value:
            check_value(turn.observation, value["content"], f"{where}.content")
        if "content_contains" in value and str(value["content_contains"]) not in turn.observation:
            raise Mismatch(
                f"{where}.content_contains: {value['content_contains']!r} "
                f"not in {turn.observation!r}"
            )

    # -- LLM invocations -------------------------------------------------------

    def _x_llm_invocations(self, value: Any) -> None:
        self._invocations(MAIN_LLM, value, "llm_invocations")

    def _queries(self, key: str) -> list[Query]:
        llm = self.world.llms.get(key)
        if not isinstance(llm, ScriptedLLM):
            raise Mismatch(f"{key} is not a recording LLM")
        return llm.invocations

    def _invocations(self, key: str, value: Any, where: str) -> None:
        queries = self._queries(key)
        spec = self.world.doc.llm if key == MAIN_LLM else None
        if spec is not None and spec.stateless:
            check_stateless(queries, where)
        if isinstance(value, int):
            check_value(len(queries), value, f"{where} (count)")
            return
        if not isinstance(value, list):
            raise Mismatch(f"{where}: expected a count or a list")
        # The list form is a prefix check (SPEC.md "Conformance"): it
        # describes the first len(value) queries; a count pins the total.
        if len(value) > len(queries):
            raise Mismatch(f"{where}: expected at least {len(value)} queries, got {len(queries)}")
        for index, (expected, query) in enumerate(zip(value, queries, strict=False)):
            check_query(query, expected or {}, f"{where}[{index}]")

    def _x_llm_received_tool_choice(self, value: Any) -> None:
        queries = self._queries(MAIN_LLM)
        if not queries:
            raise Mismatch("llm_received_tool_choice: the llm was never queried")
        for index, query in enumerate(queries):
            check_value(query.tool_choice, value, f"llm_received_tool_choice[{index}]")

    def _x_llm_received_tools(self, value: Any) -> None:
        queries = self._queries(MAIN_LLM)
        if not queries:
            raise Mismatch("llm_received_tools: the llm was never queried")
        for index, query in enumerate(queries):
            tools = [t.to_dict() for t in query.tools]
            if len(tools) != len(value):
                raise Mismatch(
                    f"llm_received_tools[{index}]: expected {len(value)} tools, "
                    f"got {[t['name'] for t in tools]}"
                )
            for position, (tool, expected) in enumerate(zip(tools, value, strict=True)):
                for field, wanted in expected.items():
                    check_value(tool.get(field), wanted, f"llm_received_tools[{index}][{position}]")

    # -- the loom --------------------------------------------------------------

    def _x_loom(self, value: Mapping[str, Any]) -> None:
        require_keys(value, ("turn_count", "turns", "identity"), "loom")
        loom = self.world.loom
        if "turn_count" in value:
            check_value(len(loom), value["turn_count"], "loom.turn_count")
        if "identity" in value:
            identity = loom.identity
            if identity is None:
                raise Mismatch("loom.identity: no root context recorded")
            for field, wanted in value["identity"].items():
                check_value(identity.get(field), wanted, f"loom.identity.{field}")
        if "turns" in value:
            self._turn_list(list(loom.turns), value["turns"], "loom.turns", prefix=True)

    def _turn_list(
        self, turns: Sequence[Turn], expected: list[Any], where: str, *, prefix: bool
    ) -> None:
        """``prefix``: the list describes the first turns (``loom.turns``, whose
        total ``turn_count`` pins); otherwise it must describe every turn."""
        if not isinstance(expected, list):
            raise Mismatch(f"{where}: expected a list of turns, not {expected!r}")
        if len(expected) > len(turns) or (not prefix and len(expected) != len(turns)):
            bound = "at least " if prefix else ""
            raise Mismatch(f"{where}: expected {bound}{len(expected)} turns, got {len(turns)}")
        for index, (turn, wanted) in enumerate(zip(turns, expected, strict=False)):
            self._turn(turn, wanted or {}, f"{where}[{index}]")

    def _turn(self, turn: Turn, wanted: Mapping[str, Any], where: str) -> None:
        loom = self.world.loom

        def resolve(reference: str) -> Any:
            parsed = parse_reference(reference)
            assert parsed is not None
            index, field = parsed
            return getattr(turn_at(loom, index), field)

        for field, expected in wanted.items():
            at = f"{where}.{field}"
            if (
                field == "entity_id"
                and isinstance(expected, str)
                and parse_reference(expected) is None
            ):
                self.labels.check(expected, turn.entity_id, at)
            elif field == "gate_calls":
                check_value([r.gate for r in turn.gate_calls], expected, at)
            elif field == "metadata":
                meta = turn.metadata.to_dict()
                for name, wanted_value in expected.items():
                    if name not in meta:
                        raise Mismatch(f"{at}: unknown metadata field {name!r}")
                    check_value(meta[name], wanted_value, f"{at}.{name}")
            elif field == "reward":
                check_value(loom.reward(turn.id), expected, at)
            elif field == "observation_contains":
                if str(expected) not in turn.observation:
                    raise Mismatch(f"{at}: {expected!r} not in {turn.observation!r}")
            elif field in _TURN_FIELDS:
                check_value(getattr(turn, field), expected, at, resolve)
            else:
                raise Mismatch(f"{at}: unknown turn field -- not part of the schema")

    def _x_thread(self, value: Any) -> None:
        if isinstance(value, list):
            last = self.world.last
            if not last.turns:
                raise Mismatch("thread: the last cast recorded no turn")
            check_thread_steps(
                rendered_steps(self.world.loom.thread(last.turns[-1].id)), value, "thread"
            )
            return
        if self.world.extracted is None:
            raise Mismatch("thread: no thread was extracted")
        require_keys(value, ("length", "turns"), "thread")
        if "length" in value:
            check_value(len(self.world.extracted), value["length"], "thread.length")
        if "turns" in value:
            self._turn_list(self.world.extracted, value["turns"], "thread.turns", prefix=False)

    def _x_threads(self, value: Any) -> None:
        check_value(len(self.world.loom.threads()), value, "threads")

    def _thread_n(self, index: int, value: Mapping[str, Any], where: str) -> None:
        threads = self.world.loom.threads()
        if index >= len(threads):
            raise Mismatch(f"{where}: the loom has only {len(threads)} threads")
        thread = threads[index]
        require_keys(value, ("turns", "result", "last_turn"), where)
        if "turns" in value:
            check_value(len(thread), value["turns"], f"{where}.turns")
        if "result" in value:
            check_value(thread[-1].result, value["result"], f"{where}.result")
        if "last_turn" in value:
            self._turn(thread[-1], value["last_turn"], f"{where}.last_turn")

    def _children(self) -> list[str]:
        return [e.entity_id for e in self.world.loom.entities.values() if e.parent_entity_id]

    def _x_child_turns(self, value: Any) -> None:
        children = self._children()
        if not children:
            raise Mismatch("child_turns: no child entity was spawned")
        for child in children:
            check_value(len(self.world.loom.entity_turns(child)), value, f"child_turns[{child}]")

    def _x_child_truncated(self, value: Any) -> None:
        children = self._children()
        if not children:
            raise Mismatch("child_truncated: no child entity was spawned")
        for child in children:
            last = self.world.loom.last_turn(child)
            check_value(bool(last and last.truncated), value, f"child_truncated[{child}]")

    def _x_gate_executions(self, value: Mapping[str, Any]) -> None:
        """How often stateful fixture gates really ran (replay must not run them),
        summed over every cantrip of the case that has the gate."""
        for name, expected in value.items():
            gates = {
                id(g): g
                for spell in self.world.cantrips.values()
                if (g := spell.circle.gate(name)) is not None
            }
            counts = [c for g in gates.values() if (c := call_count(g)) is not None]
            if not counts:
                raise Mismatch(f"gate_executions: {name!r} is not a stateful fixture gate")
            check_value(sum(counts), expected, f"gate_executions.{name}")

    def _x_loom_export_exclude(self, value: Any) -> None:
        if not self.world.exports:
            raise Mismatch("loom_export_exclude: the loom was not exported")
        for export in self.world.exports:
            if str(value) in export:
                raise Mismatch(f"loom_export_exclude: {value!r} appears in the export")

    def _x_acp_responses(self, value: Any) -> None:
        responses = {str(r.get("id")): r for r in self.world.acp_responses}
        for index, expected in enumerate(value):
            require_keys(expected, ("id", "has_result", "result_contains", "has_error"), "acp")
            where = f"acp_responses[{index}]"
            response = responses.get(str(expected.get("id")))
            if response is None:
                raise Mismatch(f"{where}: no response with id {expected.get('id')!r}")
            if "has_result" in expected:
                check_value("result" in response, expected["has_result"], f"{where}.has_result")
            if "has_error" in expected:
                check_value("error" in response, expected["has_error"], f"{where}.has_error")
            if "result_contains" in expected:
                if "result" not in response:
                    raise Mismatch(f"{where}: an error came back: {response.get('error')}")
                text = json.dumps(response["result"], default=str)
                if str(expected["result_contains"]) not in text:
                    raise Mismatch(
                        f"{where}.result_contains: {expected['result_contains']!r} not in {text}"
                    )

    def _x_logs_exclude(self, value: Any) -> None:
        if not self.world.logs:
            raise Mismatch("logs_exclude: nothing was logged, so nothing was checked")
        for line in self.world.logs:
            if str(value) in line:
                raise Mismatch(f"logs_exclude: {value!r} appears in a log record: {line!r}")


_TURN_FIELDS = frozenset(
    {
        "id",
        "parent_id",
        "entity_id",
        "sequence",
        "utterance",
        "observation",
        "terminated",
        "truncated",
        "reason",
        "result",
        "intent",
        "cantrip_id",
        "role",
    }
)
