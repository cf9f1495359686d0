"""Evaluators: each expectation of a case, checked against how its cast went.

Every evaluator returns :class:`Check` values -- a name, whether it held, and
a message that says why when it did not. Plain checks are cheap and pure; the
two that run code of the user's (``function``) or a pattern over what the model
wrote (``result_matches``) run off the event loop, so no evaluator can stall
other cases (see :func:`cantrip.evals._runner`). An evaluator that raises marks
its case *errored*, never the run.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from cantrip._errors import ConstructionError
from cantrip._json_schema import compile_schema
from cantrip._outcome import CastResult
from cantrip.evals._suite import Expect, GateExpectation
from cantrip.llm._contract import plain_json
from cantrip.loom._model import GateCallRecord, Turn, result_text


@attrs.frozen
class Check:
    """One expectation's verdict."""

    name: str
    passed: bool
    message: str = ""
    detail: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "passed": self.passed}
        if self.message:
            out["message"] = self.message
        if self.detail:
            out["detail"] = self.detail
        return out


@attrs.frozen
class Outcome:
    """What an evaluator sees of one run of a case."""

    intent: str
    result: CastResult
    turns: tuple[Turn, ...]
    """The root entity's turns of this cast, in order."""
    latency_s: float

    @property
    def text(self) -> str:
        return result_text(self.result.result)

    @property
    def tokens(self) -> int:
        usage = self.result.usage
        return int(usage.prompt_tokens + usage.completion_tokens)

    def calls(self) -> Iterator[GateCallRecord]:
        """The gate calls the agent made, in order (those skipped or cut off are not made)."""
        for turn in self.turns:
            for record in turn.gate_calls:
                if record.status in ("ok", "error", "crashed"):
                    yield record


class EvaluatorError(Exception):
    """An evaluator could not decide (a user function that raised, a bad schema)."""


def plain_checks(expect: Expect, outcome: Outcome) -> list[Check]:
    """Every expectation that needs neither the user's code nor a judge."""
    checks: list[Check] = []

    def add(name: str, passed: bool, why: str) -> None:
        checks.append(Check(name, passed, "" if passed else why))

    result = outcome.result
    text = outcome.text
    if "result_equals" in expect.model_fields_set:
        wanted = expect.result_equals
        same = result.result == wanted or (isinstance(wanted, str) and text == wanted)
        add("result_equals", same, f"result is {_short(text)!r}, not {_short(wanted)!r}")
    if expect.result_contains is not None:
        wanted_all = (
            [expect.result_contains]
            if isinstance(expect.result_contains, str)
            else expect.result_contains
        )
        missing = [w for w in wanted_all if w not in text]
        add(
            "result_contains",
            not missing,
            f"result {_short(text)!r} lacks {', '.join(map(repr, missing))}",
        )
    if expect.result_schema is not None:
        checks.append(_schema_check(expect.result_schema, result.result))
    if expect.gates is not None:
        checks.append(_ordered_gates(expect.gates, list(outcome.calls())))
    if expect.gates_never is not None:
        called = [r.gate for r in outcome.calls() if r.gate in expect.gates_never]
        add("gates_never", not called, f"called {', '.join(sorted(set(called)))}")
    turns = len(outcome.turns)
    if expect.max_turns is not None:
        ok = turns <= expect.max_turns
        add("max_turns", ok, f"took {turns} turns (max {expect.max_turns})")
    if expect.min_turns is not None:
        ok = turns >= expect.min_turns
        add("min_turns", ok, f"took {turns} turns (min {expect.min_turns})")
    if expect.max_tokens is not None:
        # Tokens nobody reported are unknown, never 0: the budget cannot be shown kept.
        unreported = result.usage.missing
        ok = not unreported and outcome.tokens <= expect.max_tokens
        said = (
            f"at least {outcome.tokens} tokens and an unknown number more: the provider "
            "reported no usage for a call"
            if unreported
            else f"{outcome.tokens} tokens"
        )
        add("max_tokens", ok, f"used {said} (max {expect.max_tokens})")
    if expect.max_cost_usd is not None:
        cost = result.cost_usd
        ok = cost is not None and cost <= expect.max_cost_usd
        said = "an unknown amount" if cost is None else f"${cost:.6f}"
        add("max_cost_usd", ok, f"cost {said} (max ${expect.max_cost_usd})")
    if expect.max_latency_s is not None:
        ok = outcome.latency_s <= expect.max_latency_s
        add("max_latency_s", ok, f"took {outcome.latency_s:.3f} s (max {expect.max_latency_s} s)")
    if expect.ended is not None:
        ended = "terminated" if result.terminated else "truncated"
        ok = ended == expect.ended
        add("ended", ok, f"the cast {ended} ({result.reason}), not {expect.ended}")
    if expect.reason is not None:
        ok = result.reason == expect.reason
        add("reason", ok, f"ended by {result.reason!r}, not {expect.reason!r}")
    return checks


def pattern_check(pattern: str, outcome: Outcome) -> Check:
    """``result_matches``: run off the event loop by the caller (a pattern may backtrack)."""
    found = re.search(pattern, outcome.text) is not None
    return Check(
        "result_matches",
        found,
        "" if found else f"result {_short(outcome.text)!r} does not match /{pattern}/",
    )


def function_check(ref: str, outcome: Outcome) -> Check:
    """``module:function``: the user's own verdict. Run off the event loop by the caller."""
    func = resolve_function(ref)
    try:
        verdict = func(outcome)
    except Exception as exc:  # the user's evaluator is a boundary: it errors the case
        raise EvaluatorError(f"function {ref} raised {type(exc).__name__}: {exc}") from exc
    if isinstance(verdict, tuple) and len(verdict) == 2:
        passed, message = bool(verdict[0]), str(verdict[1])
    elif isinstance(verdict, bool):
        passed, message = verdict, ""
    else:
        raise EvaluatorError(
            f"function {ref} returned {type(verdict).__name__}; return a bool or (bool, message)"
        )
    return Check(f"function {ref}", passed, message if not passed or message else "")


def resolve_function(ref: str) -> Callable[[Outcome], Any]:
    """The function ``module:function`` names (raises :class:`EvaluatorError`)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise EvaluatorError(f"function {ref!r}: write it as module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EvaluatorError(f"function {ref}: cannot import {module_name} ({exc})") from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise EvaluatorError(f"function {ref}: {module_name} has no function {attr!r}")
    return func  # type: ignore[no-any-return]


def _schema_check(schema: dict[str, Any], value: Any) -> Check:
    """``result_schema``, checked by the linear-time validator the output schema uses
    (no backtracking pattern, no reference retrieval: ``cantrip._json_schema``)."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):  # a JSON text is checked as its value
            value = json.loads(value)
    try:
        validator = compile_schema(schema)
    except ConstructionError as exc:
        raise EvaluatorError(f"result_schema cannot be used: {exc}") from exc
    errors = list(validator.iter_errors(plain_json(value)))
    if not errors:
        return Check("result_schema", True)
    first = errors[0]
    where = "/".join(str(p) for p in first.instance_path) or "the result"
    return Check("result_schema", False, f"{where}: {first.message}")


def _ordered_gates(wanted: Sequence[str | GateExpectation], calls: list[GateCallRecord]) -> Check:
    """Each wanted gate found in order (others may come between); args are subsets."""
    position = 0
    for expected in wanted:
        gate = expected if isinstance(expected, str) else expected.gate
        args = {} if isinstance(expected, str) else expected.args
        while position < len(calls) and not _matches(calls[position], gate, args):
            position += 1
        if position == len(calls):
            made = ", ".join(r.gate for r in calls) or "none"
            want = gate if not args else f"{gate}({json.dumps(args, sort_keys=True)})"
            return Check("gates", False, f"no call to {want} in order (calls made: {made})")
        position += 1
    return Check("gates", True)


def _matches(record: GateCallRecord, gate: str, args: dict[str, Any]) -> bool:
    if record.gate != gate:
        return False
    given = record.args
    return all(key in given and _same(given[key], value) for key, value in args.items())


def _same(given: Any, wanted: Any) -> bool:
    if (
        isinstance(wanted, dict)
        and isinstance(given, dict | type(given))
        and hasattr(given, "items")
    ):
        return all(k in given and _same(given[k], v) for k, v in wanted.items())
    return bool(given == wanted)


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
