"""The conformance runner: executes a tests.yaml file against the public API.

The runner interprets the schema generically. Setup keys become a declarative
spec document plus named scripted LLMs; each action key maps to one public
API call; each expectation key reads the resulting state (cast results, the
loom, the LLMs' recorded queries). It never looks at a case's rule id or name
to decide anything, never fabricates a response, and treats any key it does
not know as a failure.

Each case runs in its own trio run on a virtual clock (``trio.testing.
MockClock`` with a small autojump threshold): retries still back off for
their full delays, but idle waiting costs no real time.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing
import yaml

from cantrip._cantrip import Cantrip
from cantrip._errors import CantripError
from cantrip._outcome import CastResult
from cantrip.conformance._matchers import (
    LabelBinding,
    Mismatch,
    check_value,
    parse_reference,
    require_keys,
)
from cantrip.llm._contract import LLM, Message, Query
from cantrip.llm._scripted import ScriptedLLM
from cantrip.loom._export import export_jsonl
from cantrip.loom._loom import Loom
from cantrip.loom._model import Turn
from cantrip.loom._view import logical_turns
from cantrip.protocols._acp import AcpServer
from cantrip.spec import LLMSpec, SpecDocument, build_cantrip, build_llm, parse_spec
from gates.fixtures import call_count

CASE_KEYS = ("rule", "name", "description", "setup", "action", "expect")
MAIN_LLM = "llm"


def is_llm_key(key: str) -> bool:
    """Setup keys that declare an LLM: ``llm``, ``llm_*``, ``*_llm`` and ``*_llm_*``."""
    return key == MAIN_LLM or key.startswith("llm_") or key.endswith("_llm") or "_llm_" in key


@attrs.frozen
class CaseResult:
    rule: str
    name: str
    passed: bool
    message: str = ""

    @property
    def label(self) -> str:
        return f"[{self.rule}] {self.name}"


def load_cases(path: str | Path) -> list[dict[str, Any]]:
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CantripError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, list):
        raise CantripError(f"{path}: a tests file is a YAML list of cases")
    return [case for case in data if case is not None]


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@attrs.define
class World:
    """Everything a case's actions produced, for its expectations to read."""

    doc: SpecDocument
    llms: dict[str, LLM]
    """Named LLMs by setup key (``llm`` is the cantrip's own)."""
    registry: dict[str, LLM]
    """Named LLMs by the name casts and children use."""
    loom: Loom
    fs_root: Path
    cantrips: dict[str | None, Cantrip] = attrs.field(factory=dict)
    casts: list[CastResult] = attrs.field(factory=list)
    error: BaseException | None = None
    extracted: list[Turn] | None = None
    exports: list[str] = attrs.field(factory=list)
    logs: list[str] = attrs.field(factory=list)
    acp_responses: list[dict[str, Any]] = attrs.field(factory=list)

    def cantrip(self, llm_name: str | None = None, *, strict: bool = False) -> Cantrip:
        """The case's cantrip. Without an ``llm`` of its own, a cast that names an
        LLM gets the cantrip built with that LLM (the swap of spec 2.2)."""
        main = self.llms.get(MAIN_LLM)
        key = None if main is not None or llm_name is None else llm_name
        if strict or key not in self.cantrips:
            built = build_cantrip(
                self.doc,
                strict_medium=strict,
                base_dir=self.fs_root,
                fs_root=self.fs_root,
                llms=self.registry,
                loom=self.loom,
                llm=main if key is None else self.named(key),
            )
            if strict:
                return built
            self.cantrips[key] = built
        return self.cantrips[key]

    def named(self, llm_name: str | None) -> LLM | None:
        if llm_name is None:
            return None
        llm = self.registry.get(llm_name)
        if llm is None:
            raise Mismatch(f"the case names unknown llm {llm_name!r}")
        return llm

    @property
    def main(self) -> Cantrip:
        if None in self.cantrips:
            return self.cantrips[None]
        return next(iter(self.cantrips.values()))

    @property
    def last(self) -> CastResult:
        if not self.casts:
            raise Mismatch("no cast completed")
        return self.casts[-1]


class Runner:
    """Runs cases; one fresh world per case."""

    def run_file(self, path: str | Path) -> list[CaseResult]:
        return [self.run_case(case) for case in load_cases(path)]

    def run_case(self, case: Mapping[str, Any]) -> CaseResult:
        rule, name = str(case.get("rule", "?")), str(case.get("name", "?"))
        capture = _LogCapture()
        root = logging.getLogger()
        previous_level = root.level
        root.addHandler(capture)
        root.setLevel(logging.DEBUG)
        tmp = Path(tempfile.mkdtemp(prefix="cantrip-case-"))
        try:
            clock = trio.testing.MockClock(autojump_threshold=0.05)
            trio.run(self._run, case, tmp, capture, clock=clock)
        except Mismatch as failure:
            return CaseResult(rule, name, False, str(failure))
        except Exception as exc:  # noqa: BLE001 -- a crashing case is a failed case
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return CaseResult(rule, name, False, f"crashed: {detail}")
        finally:
            root.removeHandler(capture)
            root.setLevel(previous_level)
            shutil.rmtree(tmp, ignore_errors=True)
        return CaseResult(rule, name, True)

    async def _run(self, case: Mapping[str, Any], tmp: Path, capture: _LogCapture) -> None:
        require_keys(case, CASE_KEYS, "case")
        world = self._world(dict(case.get("setup") or {}), tmp)
        world.logs = capture.lines
        try:
            for step in _steps(case.get("action")):
                await self._act(world, step)
        except CantripError as exc:
            world.error = exc
        Expectations(world).check(dict(case.get("expect") or {}))

    # -- setup -----------------------------------------------------------------

    def _world(self, setup: dict[str, Any], tmp: Path) -> World:
        fs_root = tmp / "fs"
        fs_root.mkdir()
        if "filesystem" in setup:
            for raw_path, content in (setup.pop("filesystem") or {}).items():
                target = fs_root / Path(raw_path).relative_to(Path(raw_path).anchor)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(str(content), encoding="utf-8")
        llm_specs = {k: setup.pop(k) for k in list(setup) if is_llm_key(k)}
        main_spec = llm_specs.pop(MAIN_LLM, None)
        doc = parse_spec({**setup, MAIN_LLM: main_spec}, source="setup")
        problems: list[str] = []
        llms: dict[str, LLM] = {}
        registry: dict[str, LLM] = {}
        if doc.llm is not None:
            built = build_llm(_shared_script(doc.llm), problems, MAIN_LLM)
            if built is not None:
                llms[MAIN_LLM] = built
        for key, raw in llm_specs.items():
            spec = parse_spec({MAIN_LLM: raw}, source=f"setup.{key}").llm
            if spec is None:
                continue
            named = _shared_script(spec).model_copy(update={"name": spec.name or key})
            built = build_llm(named, problems, key)
            if built is not None:
                llms[key] = built
                registry[spec.name or key] = built
        if problems:
            raise Mismatch("setup: " + "; ".join(problems))
        return World(doc=doc, llms=llms, registry=registry, loom=Loom(), fs_root=fs_root)

    # -- actions ---------------------------------------------------------------

    async def _act(self, world: World, step: Mapping[str, Any]) -> None:
        for key, value in step.items():
            if key == "then":
                for then_step in _steps(value):
                    await self._act(world, then_step)
                continue
            handler = _ACTIONS.get(key)
            if handler is None:
                raise Mismatch(f"action: unknown key {key!r} -- not part of the schema")
            await handler(self, world, value)

    async def _construct(self, world: World, value: Any) -> None:
        if value is not True:
            raise Mismatch(f"construct_cantrip takes true, not {value!r}")
        world.cantrip(strict=True)

    async def _cast(self, world: World, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise Mismatch(f"cast takes a mapping, not {value!r}")
        require_keys(value, ("intent", "llm"), "cast")
        spell = world.cantrip(value.get("llm"))
        llm = world.named(value.get("llm"))
        world.casts.append(await spell.cast_async(value.get("intent"), llm=llm))

    async def _mutate_identity(self, world: World, value: Any) -> None:
        identity = world.main.identity
        for field, new in dict(value).items():
            setattr(identity, field, new)

    async def _delete_turn(self, world: World, value: Any) -> None:
        world.loom.delete_turn(_turn_at(world.loom, value).id)

    async def _annotate_reward(self, world: World, value: Any) -> None:
        require_keys(value, ("turn", "reward"), "annotate_reward")
        world.loom.annotate_reward(_turn_at(world.loom, value["turn"]).id, value["reward"])

    async def _extract_thread(self, world: World, value: Any) -> None:
        threads = world.loom.threads()
        if not isinstance(value, int) or not 0 <= value < len(threads):
            raise Mismatch(f"extract_thread: no thread {value!r} (loom has {len(threads)})")
        world.extracted = threads[value]

    async def _fork(self, world: World, value: Any) -> None:
        require_keys(value, ("from_turn", "llm", "intent"), "fork")
        thread = world.loom.thread(world.last.turns[-1].id)
        sequence = value.get("from_turn")
        points = [t for t in thread if t.sequence == sequence]
        if not points:
            raise Mismatch(f"fork: the last cast's thread has no turn {sequence!r}")
        spell = world.cantrip()
        async with spell.fork(points[0], llm=world.named(value.get("llm"))) as entity:
            world.casts.append(await entity.send(value.get("intent")))

    async def _export_loom(self, world: World, value: Any) -> None:
        require_keys(value, ("format", "redaction"), "export_loom")
        if value.get("format", "jsonl") != "jsonl":
            raise Mismatch(f"export_loom: unsupported format {value.get('format')!r}")
        world.exports.append(export_jsonl(world.loom, redaction=value.get("redaction", "default")))

    async def _acp_exchange(self, world: World, value: Any) -> None:
        if not isinstance(value, list):
            raise Mismatch("acp_exchange takes a list of JSON-RPC requests")
        notes: list[dict[str, Any]] = []

        async def notify(message: dict[str, Any]) -> None:
            notes.append(message)

        server = AcpServer(world.cantrip(), notify=notify)
        try:
            for request in value:
                message = {"jsonrpc": "2.0", **dict(request)}
                response = await server.handle(message)
                if response is not None:
                    world.acp_responses.append(response)
        finally:
            await server.aclose()


_ACTIONS: dict[str, Callable[[Runner, World, Any], Any]] = {
    "construct_cantrip": Runner._construct,
    "cast": Runner._cast,
    "mutate_identity": Runner._mutate_identity,
    "delete_turn": Runner._delete_turn,
    "annotate_reward": Runner._annotate_reward,
    "extract_thread": Runner._extract_thread,
    "fork": Runner._fork,
    "export_loom": Runner._export_loom,
    "acp_exchange": Runner._acp_exchange,
}


def _shared_script(spec: LLMSpec) -> LLMSpec:
    """A vector's scripted LLMs share one cursor, in query order, unless the vector
    says otherwise: the reference vectors interleave a parent's and its children's
    answers in one script and count queries across casts (SPEC.md "Conformance")."""
    if spec.script is not None:
        return spec
    return spec.model_copy(update={"script": "shared"})


def _steps(action: Any) -> list[Mapping[str, Any]]:
    if action is None:
        return []
    if isinstance(action, list):
        return [dict(step) for step in action]
    if isinstance(action, Mapping):
        return [dict(action)]
    raise Mismatch(f"action must be a mapping or a list, not {action!r}")


def _turn_at(loom: Loom, index: Any) -> Turn:
    turns = loom.turns
    if not isinstance(index, int) or not 0 <= index < len(turns):
        raise Mismatch(f"no turn {index!r} in the loom (it has {len(turns)})")
    return turns[index]


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
        _check_usage(self.world.last.usage.to_dict(), value, "usage")

    def _x_cumulative_usage(self, value: Any) -> None:
        """The last cast's entity's running total: the sum over every turn the loom
        records for that entity (PROD-3), read from the loom, not from the cast."""
        entity_id = self.world.last.entity_id
        usage = sum(
            (t.metadata.usage for t in self.world.loom.entity_turns(entity_id)),
            start=self.world.last.usage.__class__(),
        ).to_dict()
        _check_usage(usage, value, "cumulative_usage")

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
            _check_stateless(queries, where)
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
            _check_query(query, expected or {}, f"{where}[{index}]")

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
            return getattr(_turn_at(loom, index), field)

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


def _message_text(message: Message) -> str:
    return message.text()


def _check_query(query: Query, expected: Mapping[str, Any], where: str) -> None:
    messages = list(query.messages)
    require_keys(
        expected,
        (
            "messages",
            "message_count",
            "first_message",
            "messages_include",
            "messages_exclude",
            "message_count_includes",
            "message_count_excludes",
        ),
        where,
    )
    if "messages" in expected:
        wanted = expected["messages"]
        if len(wanted) != len(messages):
            raise Mismatch(f"{where}.messages: expected {len(wanted)}, got {len(messages)}")
        for index, (message, spec) in enumerate(zip(messages, wanted, strict=True)):
            _check_message(message, spec, f"{where}.messages[{index}]")
    if "message_count" in expected:
        check_value(len(messages), expected["message_count"], f"{where}.message_count")
    if "first_message" in expected:
        if not messages:
            raise Mismatch(f"{where}.first_message: no messages")
        _check_message(messages[0], expected["first_message"], f"{where}.first_message")
    if "messages_include" in expected:
        wanted_text = str(expected["messages_include"])
        if not any(wanted_text in _message_text(m) for m in messages):
            raise Mismatch(f"{where}.messages_include: no message contains {wanted_text!r}")
    if "messages_exclude" in expected:
        wanted_text = str(expected["messages_exclude"])
        if any(wanted_text in _message_text(m) for m in messages):
            raise Mismatch(f"{where}.messages_exclude: a message contains {wanted_text!r}")
    for key, default in (("message_count_includes", "at_least(1)"), ("message_count_excludes", 0)):
        if key in expected:
            _check_message_count(messages, expected[key], default, f"{where}.{key}")


def _check_message_count(messages: Sequence[Message], spec: Any, default: Any, where: str) -> None:
    """How many messages contain a text: ``"X"`` (at least one for ``_includes``,
    none for ``_excludes``) or ``{text: "X", count: n}`` (exactly that many, or any
    matcher such as ``at_least(2)``)."""
    if isinstance(spec, Mapping):
        require_keys(spec, ("text", "count"), where)
        if "text" not in spec or "count" not in spec:
            raise Mismatch(f"{where}: the mapping form needs both text and count")
        text, wanted = str(spec["text"]), spec["count"]
    else:
        text, wanted = str(spec), default
    count = sum(1 for m in messages if text in _message_text(m))
    check_value(count, wanted, f"{where} (messages containing {text!r})")


def _check_message(message: Message, spec: Mapping[str, Any], where: str) -> None:
    require_keys(spec, ("role", "content"), where)
    for field, wanted in spec.items():
        check_value(getattr(message, field), wanted, f"{where}.{field}")


def _check_stateless(queries: Sequence[Query], where: str) -> None:
    """An LLM without memory must be sent the whole context every time (LLM-1)."""
    if len(queries) < 2:
        raise Mismatch(
            f"{where}: the llm is declared stateless, but with {len(queries)} queries "
            "there is no resent context to check"
        )
    for index in range(1, len(queries)):
        before, now = list(queries[index - 1].messages), list(queries[index].messages)
        if len(now) <= len(before) or now[: len(before)] != before:
            raise Mismatch(f"{where}[{index}]: the query did not resend the full prior context")


def summarize(results: Sequence[CaseResult]) -> str:
    passed = sum(1 for r in results if r.passed)
    return f"{passed} passed, {len(results) - passed} failed"


def _check_usage(usage: Mapping[str, int], value: Any, where: str) -> None:
    if not isinstance(value, Mapping) or not value:
        raise Mismatch(f"{where} takes a mapping of usage fields, not {value!r}")
    for field, expected in value.items():
        if field not in usage:
            raise Mismatch(f"{where}: unknown usage field {field!r}")
        check_value(usage[field], expected, f"{where}.{field}")


# -- errors ---------------------------------------------------------------------


def check_error(error: BaseException | None, spec: Any) -> None:
    """``error:`` -- the case's action raised a :class:`CantripError`.

    The string form names a phrase the message must contain as whole words
    (case-insensitive): ``"intent"`` matches "intent is required" but not
    "intents". The mapping form ``{kind, message}`` also pins the error's kind,
    the exact class name (``IntentError``, ``ConstructionError``, ...), so a
    different failure that happens to mention the same words fails the case.
    """
    if isinstance(spec, Mapping):
        require_keys(spec, ("kind", "message"), "error")
        if "kind" not in spec and "message" not in spec:
            raise Mismatch("error: the mapping form needs kind, message or both")
        kind, phrase = spec.get("kind"), spec.get("message")
    else:
        kind, phrase = None, spec
    described = f"kind {kind!r}" if kind is not None else ""
    if phrase is not None:
        described += (" and " if described else "") + f"a message containing {str(phrase)!r}"
    if error is None:
        raise Mismatch(f"expected an error ({described}), but none was raised")
    got = f"{type(error).__name__}: {error}"
    if kind is not None and type(error).__name__ != str(kind):
        raise Mismatch(f"error: expected kind {kind!r}, got {got}")
    if phrase is not None and not _contains_phrase(str(error), str(phrase)):
        raise Mismatch(f"error: expected a message containing {str(phrase)!r}, got {got}")


def _contains_phrase(text: str, phrase: str) -> bool:
    """``phrase`` occurs in ``text`` as whole words (case-insensitive)."""
    if not phrase.strip():
        return False
    pattern = r"(?<!\w)" + re.escape(phrase.strip()) + r"(?!\w)"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


# -- threads as steps -----------------------------------------------------------

_STEP_KEYS = ("role", "content", "content_contains", "gate_calls", "is_error")


def rendered_steps(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """A thread as the alternating steps it is made of, read from the recorded turns.

    Each logical turn (delegation pieces merged) contributes an ``entity`` step
    when the entity said anything (text, tool calls or code) and a ``circle``
    step when the circle answered (an observation, gate calls, or the verdict
    that ended the thread). A turn missing either shows as two steps of the same
    role in a row.
    """
    steps: list[dict[str, Any]] = []
    for turn in logical_turns(turns):
        if turn.utterance or turn.tool_calls or turn.content:
            steps.append(
                {
                    "role": "entity",
                    "content": turn.utterance,
                    "gate_calls": [r.gate for r in turn.gate_calls],
                }
            )
        if turn.observation or turn.gate_calls or turn.terminated or turn.truncated:
            steps.append(
                {
                    "role": "circle",
                    "content": turn.observation,
                    "gate_calls": [r.gate for r in turn.gate_calls],
                    "is_error": turn.is_error,
                }
            )
    return steps


def check_thread_steps(steps: Sequence[Mapping[str, Any]], expected: list[Any], where: str) -> None:
    """The list form of ``thread:``: the steps must alternate, there must be exactly
    as many as listed, and every key given for a step must match it."""
    for index in range(1, len(steps)):
        if steps[index]["role"] == steps[index - 1]["role"]:
            raise Mismatch(f"{where}: two {steps[index]['role']} steps in a row at step {index}")
    if len(expected) != len(steps):
        roles = [s["role"] for s in steps]
        raise Mismatch(f"{where}: expected {len(expected)} steps, the thread has {roles}")
    for index, (step, wanted) in enumerate(zip(steps, expected, strict=True)):
        at = f"{where}[{index}]"
        if not isinstance(wanted, Mapping):
            raise Mismatch(f"{at}: a step is a mapping such as {{role: entity}}, not {wanted!r}")
        require_keys(wanted, _STEP_KEYS, at)
        for field, value in wanted.items():
            if field == "content_contains":
                if str(value) not in step["content"]:
                    raise Mismatch(f"{at}.content_contains: {value!r} not in {step['content']!r}")
            elif field not in step:
                raise Mismatch(f"{at}.{field}: a {step['role']} step has no {field}")
            else:
                check_value(step[field], value, f"{at}.{field}")
