"""Evals on the loom: run cases against an agent, score them, record and replay.

The Python face of ``cantrip eval``::

    from cantrip.evals import Case, Expect, Suite, evaluate

    suite = Suite([Case(name="greets", intent="Greet the world, then finish.",
                        expect=Expect(result_contains="greeted", gates=["echo", "done"]))])
    report = evaluate(suite, spec="examples/hello.toml")
    assert report.passed

``record`` keeps every case's cast in a loom; ``replay`` answers the agent's
model requests from such a loom (:class:`ReplayLLM`), matched by the conversation,
so a suite runs offline and deterministically in CI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import trio

from cantrip._cantrip import Cantrip
from cantrip._errors import ConstructionError
from cantrip.evals._add import add_case
from cantrip.evals._evaluators import Check, EvaluatorError, Outcome
from cantrip.evals._record import run_record
from cantrip.evals._replay import ReplayDivergence, ReplayIndex, ReplayLLM, conversation_key
from cantrip.evals._report import compare, junit_xml, read_report, table
from cantrip.evals._runner import EvalReport, RunResult, new_run_id, now_iso
from cantrip.evals._runner import run_cases as _run_cases
from cantrip.evals._suite import (
    EXPECTATIONS,
    Case,
    Expect,
    GateExpectation,
    JudgeSpec,
    Suite,
    load_suite,
)
from cantrip.llm._contract import LLM
from cantrip.loom._loom import Loom

LoomLike = Loom | str | Path


def _open(loom: LoomLike) -> Loom:
    return loom if isinstance(loom, Loom) else Loom.open(loom)


def replay_llm(recording: LoomLike) -> ReplayLLM:
    """A :class:`ReplayLLM` answering from every cast recorded in ``recording``."""
    return ReplayLLM(ReplayIndex.from_loom(_open(recording)))


async def run_suite(
    suite: Suite,
    *,
    spec: str | Path | None = None,
    cantrip: Callable[[Loom], Cantrip] | None = None,
    record: LoomLike | None = None,
    replay: LoomLike | ReplayLLM | None = None,
    loom: LoomLike | None = None,
    judges: Mapping[str, LLM] | None = None,
    concurrency: int = 4,
    repeat: int = 1,
    max_cost_usd: float | None = None,
    on_result: Callable[[RunResult], None] | None = None,
) -> EvalReport:
    """Run ``suite`` and report.

    The agent comes from ``spec`` (a spec file; else the suite's own ``spec``) or
    from ``cantrip``, a function that builds it on the loom it is given. Its casts
    are recorded in ``record`` (kept for a later replay), else in ``loom``, else in
    memory. ``replay`` answers the agent's model requests from a recorded loom.
    """
    if record is not None and replay is not None:
        raise ConstructionError("record or replay, not both")
    cast_loom = _open(record) if record is not None else _open(loom) if loom is not None else Loom()
    llm: LLM | None = None
    if isinstance(replay, ReplayLLM):
        llm = replay
    elif replay is not None:
        llm = replay_llm(replay)
    factory = _factory(suite, spec, cantrip, cast_loom, llm)
    if judges is None and suite.llms:
        judges = suite_llms(suite)
    mode: Literal["live", "record", "replay"] = (
        "replay" if replay is not None else "record" if record is not None else "live"
    )
    started, clock = now_iso(), trio.current_time()
    run_id = new_run_id()
    runs = await _run_cases(
        suite,
        factory,
        llm=llm,
        judges=judges,
        concurrency=concurrency,
        repeat=repeat,
        max_cost_usd=max_cost_usd,
        on_result=on_result,
        run_id=run_id,
    )
    spec_path = spec if spec is not None else suite.spec
    report = EvalReport(
        suite=suite.source,
        spec=str(spec_path) if spec_path is not None else None,
        mode=mode,
        started=started,
        duration_s=trio.current_time() - clock,
        repeat=repeat,
        concurrency=concurrency,
        runs=tuple(runs),
        loom=str(getattr(cast_loom.store, "path", "")) or None,
        max_cost_usd=max_cost_usd,
        run_id=run_id,
    )
    # the verdicts, beside the casts: the viewer lists runs and cases from this record
    cast_loom.register_entity(run_record(report))
    await cast_loom.sync()
    return report


def evaluate(suite: Suite | str | Path, **options: Any) -> EvalReport:
    """:func:`run_suite` from synchronous code (a suite object or a suite file)."""
    loaded = suite if isinstance(suite, Suite) else load_suite(suite)
    return trio.run(lambda: run_suite(loaded, **options))


def suite_llms(suite: Suite) -> dict[str, LLM]:
    """The LLMs a suite declares for its judges (``llms:``, each in the spec's ``[llm]`` form)."""
    import pydantic

    from cantrip.spec import LLMSpec, build_llm

    problems: list[str] = []
    built: dict[str, LLM] = {}
    for name, config in suite.llms.items():
        try:
            spec = LLMSpec.model_validate(config)
        except pydantic.ValidationError as exc:
            problems.append(f"{suite.source}: llms.{name}: {exc.errors()[0]['msg']}")
            continue
        llm = build_llm(spec, problems, f"{suite.source}: llms.{name}")
        if llm is not None:
            built[name] = llm
    if problems:
        raise ConstructionError(problems)
    return built


def _factory(
    suite: Suite,
    spec: str | Path | None,
    build: Callable[[Loom], Cantrip] | None,
    loom: Loom,
    llm: LLM | None,
) -> Callable[[], Cantrip]:
    """What makes one run's cantrip. From a spec file, a replaying run swaps in the
    replay before the spec's own LLM is built, so it needs no key and no network."""
    if build is not None:
        return lambda: build(loom)
    path = Path(spec) if spec is not None else suite.spec
    if path is None:
        raise ConstructionError(
            f"{suite.source}: no spec to run the cases against: give 'spec' in the suite or --spec"
        )
    from cantrip.spec import build_cantrip, load_spec_file

    doc = load_spec_file(path)
    # every problem now, once; a memory's store is the runner's (one per run of a case)
    build_cantrip(doc, base_dir=path.parent, loom=loom, llm=llm, memory_given=True)
    return lambda: build_cantrip(doc, base_dir=path.parent, loom=loom, llm=llm, memory_given=True)


__all__ = [
    "EXPECTATIONS",
    "Case",
    "Check",
    "EvalReport",
    "EvaluatorError",
    "Expect",
    "GateExpectation",
    "JudgeSpec",
    "Outcome",
    "ReplayDivergence",
    "ReplayIndex",
    "ReplayLLM",
    "RunResult",
    "Suite",
    "add_case",
    "compare",
    "conversation_key",
    "evaluate",
    "junit_xml",
    "load_suite",
    "read_report",
    "replay_llm",
    "run_suite",
    "table",
]
