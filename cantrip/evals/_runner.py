"""Running a suite: every case (times ``repeat``), bounded concurrency, one report.

Each run of a case is one cast, in its own task under the run's nursery and a
:class:`trio.CapacityLimiter`. What can go wrong in a run stays in that run: the
agent's LLM failing (a replay divergence included) fails the case with the
error; an evaluator that raises errors the case; neither stops the others.
Evaluators that run the user's code or a pattern over model output run in a
worker thread, so none can hold the event loop.

The run's cost cap (``max_cost_usd``) counts the agents' casts and the judges'
calls alike; once spent, cases not yet started are skipped (a case already
running finishes: a cast is not cut in half for a report).
"""

from __future__ import annotations

import contextlib
import functools
import math
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from cantrip._cantrip import Cantrip
from cantrip._errors import LLMError
from cantrip.evals._evaluators import (
    Check,
    EvaluatorError,
    Outcome,
    function_check,
    pattern_check,
    plain_checks,
)
from cantrip.evals._judge import judge
from cantrip.evals._replay import ReplayDivergence
from cantrip.evals._suite import Case, Suite
from cantrip.llm._contract import LLM, plain_json
from cantrip.memory._settings import USER_TAG

Status = Literal["passed", "failed", "errored", "skipped"]

EVAL_TAG = "eval"
"""The first turn of every case's cast records ``{"eval": {"run", "case", "repeat"}}``
in its extras, so the loom knows which run and case a cast was (the viewer lists them)."""


def new_run_id() -> str:
    import secrets

    return f"eval-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


EVALUATOR_TIMEOUT_S = 30.0
"""How long a user function or a pattern may take before its case is errored."""


@attrs.frozen
class RunResult:
    """One run of one case."""

    case: str
    repeat: int
    status: Status
    checks: tuple[Check, ...] = ()
    error: str | None = None
    entity_id: str | None = None
    result: Any = None
    reason: str | None = None
    terminated: bool = False
    turns: int = 0
    tokens: int = 0
    cost_usd: float | None = 0.0
    judge_cost_usd: float | None = 0.0
    latency_s: float = 0.0

    @property
    def why(self) -> str:
        """One line: why this run did not pass."""
        if self.error:
            return self.error
        failed = [c.message or c.name for c in self.checks if not c.passed]
        return "; ".join(failed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "repeat": self.repeat,
            "status": self.status,
            "checks": [c.to_dict() for c in self.checks],
            "error": self.error,
            "entity_id": self.entity_id,
            "result": plain_json(self.result),
            "reason": self.reason,
            "terminated": self.terminated,
            "turns": self.turns,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "judge_cost_usd": self.judge_cost_usd,
            "latency_s": round(self.latency_s, 6),
        }


CantripFactory = Callable[[], Cantrip]
Progress = Callable[[RunResult], None]


@attrs.define
class _Budget:
    cap: float | None
    spent: float = 0.0
    unknown: bool = False

    def add(self, cost: float | None) -> None:
        if cost is None:
            self.unknown = True
        else:
            self.spent += cost

    @property
    def exhausted(self) -> bool:
        if self.cap is None:
            return False
        # an unknown cost may have spent anything: stop rather than walk past the cap
        return self.unknown or self.spent >= self.cap


async def run_cases(
    suite: Suite,
    factory: CantripFactory,
    *,
    llm: LLM | None = None,
    judges: Mapping[str, LLM] | None = None,
    concurrency: int = 4,
    repeat: int = 1,
    max_cost_usd: float | None = None,
    on_result: Progress | None = None,
    run_id: str = "",
) -> list[RunResult]:
    """Run every case ``repeat`` times; the results in suite order, then repeat order.

    ``factory`` makes the cantrip a run casts on (one per run, so a scripted LLM's
    state is never shared); ``llm``, when given, answers instead of the spec's own
    (a :class:`~cantrip.evals.ReplayLLM`)."""
    if concurrency < 1 or repeat < 1:
        raise ValueError("concurrency and repeat must be at least 1")
    budget = _Budget(max_cost_usd)
    limiter = trio.CapacityLimiter(concurrency)
    thread_limiter = trio.CapacityLimiter(max(1, min(concurrency, 8)))
    slots: list[RunResult | None] = [None] * (len(suite.cases) * repeat)

    async def one(position: int, case: Case, attempt: int, slot: object) -> None:
        try:
            if budget.exhausted:
                result = RunResult(
                    case.name,
                    attempt,
                    "skipped",
                    error=f"the run's cost cap (${budget.cap}) was spent before this case began",
                )
            else:
                result = await _run_one(
                    run_id, case, attempt, factory(), llm, judges or {}, budget, thread_limiter
                )
        finally:
            limiter.release_on_behalf_of(slot)
        slots[position] = result
        if on_result is not None:
            on_result(result)

    async with trio.open_nursery() as nursery:
        position = 0
        for case in suite.cases:
            for attempt in range(repeat):
                # a slot is taken before the task starts, so runs begin in suite order
                slot = object()
                await limiter.acquire_on_behalf_of(slot)
                nursery.start_soon(one, position, case, attempt, slot)
                position += 1
    return [r for r in slots if r is not None]


async def _run_one(
    run_id: str,
    case: Case,
    attempt: int,
    spell: Cantrip,
    llm: LLM | None,
    judges: Mapping[str, LLM],
    budget: _Budget,
    thread_limiter: trio.CapacityLimiter,
) -> RunResult:
    if spell.memory is None:
        return await _judged(run_id, case, attempt, spell, llm, judges, budget, thread_limiter)
    async with fresh_memory(spell) as remembering:
        return await _judged(
            run_id, case, attempt, remembering, llm, judges, budget, thread_limiter
        )


@contextlib.asynccontextmanager
async def fresh_memory(spell: Cantrip) -> AsyncIterator[Cantrip]:
    """``spell`` with a memory store of its own, empty, in a temporary folder (removed
    after): each run of a case starts knowing nothing, so runs, repeats and earlier
    runs into the same loom never see each other's memories, and a replay's prompts
    are the recording's. (The cantrip's embedder is kept.)"""
    from cantrip.memory._sqlite import SQLiteMemory

    settings = spell.memory
    assert settings is not None
    with tempfile.TemporaryDirectory(prefix="cantrip-eval-memory-") as folder:
        store = await trio.to_thread.run_sync(
            functools.partial(SQLiteMemory, Path(folder) / "memory.db", embedder=settings.embedder)
        )
        try:
            yield spell.with_(memory=attrs.evolve(settings, store=store))
        finally:
            store.close()


async def _judged(
    run_id: str,
    case: Case,
    attempt: int,
    spell: Cantrip,
    llm: LLM | None,
    judges: Mapping[str, LLM],
    budget: _Budget,
    thread_limiter: trio.CapacityLimiter,
) -> RunResult:
    started = time.perf_counter()
    tags: dict[str, Any] = {EVAL_TAG: {"run": run_id, "case": case.name, "repeat": attempt}}
    if case.user is not None:
        tags[USER_TAG] = case.user
    session = 0  # the earlier session running (0: the case's own cast)
    try:
        for earlier in case.before:  # what the agent was told before, a session each
            session += 1
            async with spell.summon(llm=llm) as entity:
                told = await entity.send(earlier, tags=tags)
            budget.add(told.cost_usd)
        session = 0
        async with spell.summon(llm=llm) as entity:
            cast = await entity.send(case.intent, tags=tags)
    except ReplayDivergence as exc:
        error = _in_session(session, len(case.before), str(exc))
        return RunResult(case.name, attempt, "failed", error=error, latency_s=_since(started))
    except LLMError as exc:  # the agent's provider failed for good: this case fails
        error = _in_session(session, len(case.before), f"llm error: {exc}")
        return RunResult(case.name, attempt, "failed", error=error, latency_s=_since(started))
    latency = _since(started)
    budget.add(cast.cost_usd)
    outcome = Outcome(case.intent, cast, cast.turns, latency)
    base = RunResult(
        case.name,
        attempt,
        "passed",
        entity_id=cast.entity_id,
        result=cast.result,
        reason=cast.reason,
        terminated=cast.terminated,
        turns=len(cast.turns),
        tokens=outcome.tokens,
        cost_usd=cast.cost_usd,
        latency_s=latency,
    )
    expect = case.expect
    checks: list[Check] = []
    judge_cost: float | None = 0.0
    try:
        checks.extend(plain_checks(expect, outcome))
        if expect.result_matches is not None:
            pattern = expect.result_matches
            checks.append(
                await _off_loop(
                    lambda: pattern_check(pattern, outcome), thread_limiter, "result_matches"
                )
            )
        refs = [expect.function] if isinstance(expect.function, str) else (expect.function or [])
        for ref in refs:
            checks.append(
                await _off_loop(
                    functools.partial(function_check, ref, outcome), thread_limiter, ref
                )
            )
        if expect.judge is not None:
            if budget.exhausted:
                raise EvaluatorError("the run's cost cap was spent before the judge could be asked")
            judge_llm = _judge_llm(expect.judge.llm, judges, spell)
            try:
                verdict = await judge(judge_llm, expect.judge.rubric, outcome)
            except LLMError as exc:
                raise EvaluatorError(f"the judge's LLM failed: {exc}") from exc
            budget.add(verdict.cost_usd)
            judge_cost = verdict.cost_usd
            checks.append(verdict.check)
    except EvaluatorError as exc:
        return attrs.evolve(
            base, status="errored", checks=tuple(checks), error=str(exc), judge_cost_usd=judge_cost
        )
    status: Status = "passed" if all(c.passed for c in checks) else "failed"
    return attrs.evolve(base, status=status, checks=tuple(checks), judge_cost_usd=judge_cost)


def _in_session(session: int, sessions: int, error: str) -> str:
    """An error, naming the earlier session it came from (0: the case's own cast)."""
    return f"earlier session {session} of {sessions}: {error}" if session else error


async def _off_loop(work: Callable[[], Check], limiter: trio.CapacityLimiter, what: str) -> Check:
    """Run ``work`` in a worker thread; past the timeout the case errors (the thread
    is abandoned: Python cannot stop it, but the loop no longer waits on it)."""
    with trio.move_on_after(EVALUATOR_TIMEOUT_S):
        return await trio.to_thread.run_sync(work, limiter=limiter, abandon_on_cancel=True)
    raise EvaluatorError(f"{what} took longer than {EVALUATOR_TIMEOUT_S:g} s")


def _judge_llm(name: str | None, judges: Mapping[str, LLM], spell: Cantrip) -> LLM:
    if name is None:
        return spell.llm
    if name in judges:
        return judges[name]
    if name in spell.llms:
        return spell.llms[name]
    known = ", ".join(sorted({*judges, *spell.llms})) or "none"
    raise EvaluatorError(f"judge llm {name!r} is not configured (known: {known})")


def _since(started: float) -> float:
    return time.perf_counter() - started


# -- statistics ------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": round(sum(values) / len(values), 6) if values else 0.0,
        "p95": round(percentile(values, 0.95), 6),
    }


@attrs.frozen
class EvalReport:
    """A whole run: every case's runs, with per-case statistics and a summary."""

    suite: str
    spec: str | None
    mode: Literal["live", "record", "replay"]
    started: str
    duration_s: float
    repeat: int
    concurrency: int
    runs: tuple[RunResult, ...]
    loom: str | None = None
    max_cost_usd: float | None = None
    run_id: str = ""

    @property
    def passed(self) -> bool:
        return all(run.status == "passed" for run in self.runs)

    def case_names(self) -> list[str]:
        return list(dict.fromkeys(run.case for run in self.runs))

    def case_runs(self, name: str) -> list[RunResult]:
        return [run for run in self.runs if run.case == name]

    def case_summary(self, name: str) -> dict[str, Any]:
        runs = self.case_runs(name)
        counted = [r for r in runs if r.status != "skipped"]
        passes = sum(1 for r in counted if r.status == "passed")
        n = len(counted)
        costs = [r.cost_usd for r in counted if r.cost_usd is not None]
        return {
            "name": name,
            "runs": n,
            "passed": passes,
            "failed": sum(1 for r in counted if r.status == "failed"),
            "errored": sum(1 for r in counted if r.status == "errored"),
            "skipped": len(runs) - n,
            "pass_rate": round(passes / n, 6) if n else 0.0,
            "pass_at_k": 1.0 if passes else 0.0,
            "pass_all_k": 1.0 if n and passes == n else 0.0,
            "flaky": 0 < passes < n,
            "turns": spread([float(r.turns) for r in counted]),
            "tokens": spread([float(r.tokens) for r in counted]),
            "cost_usd": spread(costs),
            "cost_unknown": len(costs) < n,
            "latency_s": spread([r.latency_s for r in counted]),
            "results": [r.to_dict() for r in runs],
        }

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON data; its shape is ``cantrip.eval/1`` (see the docs)."""
        cases = [self.case_summary(name) for name in self.case_names()]
        counted = [r for r in self.runs if r.status != "skipped"]
        known_costs = [r.cost_usd for r in counted if r.cost_usd is not None]
        judge_costs = [r.judge_cost_usd for r in counted if r.judge_cost_usd is not None]
        return {
            "schema": "cantrip.eval/1",
            "run_id": self.run_id,
            "suite": self.suite,
            "spec": self.spec,
            "mode": self.mode,
            "loom": self.loom,
            "started": self.started,
            "duration_s": round(self.duration_s, 6),
            "repeat": self.repeat,
            "concurrency": self.concurrency,
            "max_cost_usd": self.max_cost_usd,
            "summary": {
                "cases": len(cases),
                "runs": len(self.runs),
                "passed": sum(1 for r in self.runs if r.status == "passed"),
                "failed": sum(1 for r in self.runs if r.status == "failed"),
                "errored": sum(1 for r in self.runs if r.status == "errored"),
                "skipped": sum(1 for r in self.runs if r.status == "skipped"),
                "pass_rate": (
                    round(sum(1 for r in counted if r.status == "passed") / len(counted), 6)
                    if counted
                    else 0.0
                ),
                "flaky": [c["name"] for c in cases if c["flaky"]],
                "tokens": sum(r.tokens for r in counted),
                "cost_usd": round(sum(known_costs), 10),
                "cost_unknown": len(known_costs) < len(counted),
                "judge_cost_usd": round(sum(judge_costs), 10),
            },
            "cases": cases,
        }


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
