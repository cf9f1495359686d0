"""Per-turn runtime overhead of the cantrip loop, with a zero-latency LLM.

What it measures
----------------
One cast per configuration, driven by a :class:`cantrip.ScriptedLLM` that
answers instantly: ``N - 1`` utterances that each make a single ``echo`` gate
call, then one ``done`` call, so the cast runs exactly ``N`` turns. The circle
is ``Circle([gates.done, gates.echo], [max_turns(N + 1)])``. Because the LLM
costs nothing, everything measured is the runtime itself: context rendering,
the retry wrapper, response validation, medium execution, gate argument
validation (pydantic), building the frozen ``Turn`` / ``GateCallRecord``
values, and recording the turn in the loom.

Two looms are compared:

* ``memory`` -- ``cantrip.Loom()`` (the in-memory store);
* ``sqlite`` -- ``cantrip.Loom.open(tmpdir / "bench.db")``, WAL mode, one
  commit per turn (a fresh database file for every run).

For each store and each ``N`` in (10, 100, 1000), the whole cast
(``Cantrip.cast_async``: summon, ``N`` turns, close) is timed with
``time.perf_counter`` inside ``trio.run``; every run is a separate
``trio.run``. The table reports the best and the median of ``--repeats`` runs,
as microseconds per turn. Building the script, the cantrip and the loom is not
timed.

Flatness: for the ``N = 1000`` runs the per-turn cost of the first 10% of turns
is compared with the last 10%, three ways:

* ``llm+gates`` -- ``Turn.metadata.duration_ms``: only the LLM query plus the
  medium/gate execution of that turn (it excludes building and recording the
  turn and updating the context);
* ``full loop`` -- the interval between the starts of consecutive turns
  (``Turn.metadata.timestamp``, microsecond resolution), i.e. everything one
  iteration of the loop costs. The last turn has no successor and is left out;
* ``overall`` -- the wall time of the whole cast divided by ``N``.

A flat runtime has a last/first ratio close to 1.0.

Targets (from the issue): flat, <= 30 us/turn in memory, <= 100 us/turn with
SQLite.

How to run
----------
From the repository root::

    python bench/turn_overhead.py                 # the table and flatness figures
    python bench/turn_overhead.py --repeats 9     # more runs per configuration
    python bench/turn_overhead.py --profile       # also cProfile memory, N=1000
    python bench/turn_overhead.py --guardrails    # only the guardrail comparisons

``--profile`` prints the top functions by cumulative and by own (tottime)
time for one in-memory cast of ``N = 1000`` turns (cyclic GC off while
profiling, so collections are not charged to random allocating frames).

Also printed: cyclic-GC time per turn (``gc.callbacks``), and a least-squares
fit of best wall time = fixed + marginal x N per store, which separates the
per-cast cost (summon, entity registration, close) from the per-turn cost.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import itertools
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

import cantrip
import gates

Store = Literal["memory", "sqlite"]
STORES: tuple[Store, ...] = ("memory", "sqlite")
SIZES: tuple[int, ...] = (10, 100, 1000)
FLATNESS_N = 1000
TARGET_US: dict[Store, float] = {"memory": 30.0, "sqlite": 100.0}
SLOW_TURN_US = 1000.0


@attrs.frozen
class Run:
    """One timed cast."""

    store: Store
    turns: int
    wall_s: float
    gc_s: float
    """Time spent in the cyclic garbage collector during the cast."""
    llm_gate_us: tuple[float, ...]
    """Per turn: ``Turn.metadata.duration_ms`` in microseconds (LLM query + gates)."""
    loop_us: tuple[float, ...]
    """Per turn but the last: start of the next turn minus start of this one."""

    @property
    def us_per_turn(self) -> float:
        return self.wall_s / self.turns * 1e6

    @property
    def gc_us_per_turn(self) -> float:
        return self.gc_s / self.turns * 1e6


class GCTimer:
    """Adds up the time the cyclic GC runs, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._started

    def __enter__(self) -> GCTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self)


def script(n: int) -> list[dict[str, Any]]:
    """``n - 1`` single echo calls, then done: a cast of exactly ``n`` turns."""
    echo = {"tool_calls": [{"gate": "echo", "args": {"text": "the quick brown fox"}}]}
    done = {"tool_calls": [{"gate": "done", "args": {"answer": "finished"}}]}
    return [echo] * (n - 1) + [done]


def make_loom(store: Store, tmpdir: Path) -> cantrip.Loom:
    if store == "memory":
        return cantrip.Loom()
    return cantrip.Loom.open(tmpdir / "bench.db")


def make_cantrip(n: int, loom: cantrip.Loom) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script(n)),  # type: ignore[arg-type]  # attrs converter=tuple
        identity=cantrip.Identity(),
        circle=cantrip.Circle([gates.done, gates.echo], [cantrip.max_turns(n + 1)]),
        loom=loom,
    )


def _start(turn: cantrip.Turn) -> datetime:
    return datetime.fromisoformat(turn.metadata.timestamp)


def run_once(store: Store, n: int) -> Run:
    """Build a fresh cantrip and loom, then time one cast of ``n`` turns in ``trio.run``."""
    with tempfile.TemporaryDirectory(prefix="cantrip-bench-") as tmp:
        loom = make_loom(store, Path(tmp))
        try:
            spell = make_cantrip(n, loom)

            async def timed() -> tuple[cantrip.CastResult, float, float]:
                with GCTimer() as gc_timer:
                    started = time.perf_counter()
                    result = await spell.cast_async("benchmark the loop")
                    wall = time.perf_counter() - started
                return result, wall, gc_timer.total

            result, wall, gc_s = trio.run(timed)
        finally:
            loom.close()
    if not result.terminated or len(result.turns) != n:
        raise RuntimeError(
            f"{store}/N={n}: expected {n} turns ending in done, got {len(result.turns)} "
            f"(reason {result.reason})"
        )
    turns = result.turns
    starts = [_start(t) for t in turns]
    return Run(
        store=store,
        turns=n,
        wall_s=wall,
        gc_s=gc_s,
        llm_gate_us=tuple(t.metadata.duration_ms * 1000.0 for t in turns),
        loop_us=tuple((b - a).total_seconds() * 1e6 for a, b in itertools.pairwise(starts)),
    )


def _median_run(group: Sequence[Run]) -> Run:
    return sorted(group, key=lambda r: r.wall_s)[len(group) // 2]


def print_table(runs: dict[tuple[Store, int], list[Run]], repeats: int) -> None:
    print(f"Per-turn overhead, zero-latency scripted LLM (best / median of {repeats} runs)")
    print()
    header = (
        f"{'store':<8}{'turns':>7}{'best us/turn':>15}{'median us/turn':>17}"
        f"{'of which gc':>13}{'target':>9}"
    )
    print(header)
    print("-" * len(header))
    for (store, n), group in runs.items():
        per_turn = [r.us_per_turn for r in group]
        best = min(per_turn)
        median = statistics.median(per_turn)
        gc_us = _median_run(group).gc_us_per_turn
        target = f"<= {TARGET_US[store]:.0f}"
        print(f"{store:<8}{n:>7}{best:>15.1f}{median:>17.1f}{gc_us:>13.1f}{target:>9}")
    print("('of which gc': cyclic-GC time inside the median run, per turn)")
    print()


def print_fit(runs: dict[tuple[Store, int], list[Run]]) -> None:
    """Least squares on best wall time = fixed + marginal * N, per store."""
    lines = []
    for store in STORES:
        points = [(n, min(r.wall_s for r in g)) for (s, n), g in runs.items() if s == store]
        if len(points) < 2:
            continue
        slope, intercept = statistics.linear_regression(
            [float(n) for n, _ in points], [w for _, w in points]
        )
        fixed = (
            f"fixed {intercept * 1e6:7.1f} us/cast"
            if intercept >= 0
            else "fixed n/a (negative: the per-turn cost is not constant in N)"
        )
        lines.append(f"{store:<8}marginal {slope * 1e6:6.1f} us/turn, {fixed}")
    if lines:
        print("Fit of best wall time = fixed + marginal x N (summon/close vs. per turn):")
        print("\n".join(lines))
        print()


def print_flatness(runs: dict[tuple[Store, int], list[Run]]) -> None:
    tenth = FLATNESS_N // 10
    print(
        f"Flatness at N={FLATNESS_N}: us/turn over turns 1-{tenth} vs "
        f"{FLATNESS_N - tenth + 1}-{FLATNESS_N}, all runs pooled"
    )
    print()
    header = (
        f"{'store':<8}{'measure':<11}{'first mean':>11}{'first med':>10}"
        f"{'last mean':>10}{'last med':>9}{'ratio mean':>11}{'ratio med':>10}"
    )
    print(header)
    print("-" * len(header))
    for store in STORES:
        group = runs.get((store, FLATNESS_N))
        if not group:
            continue
        measures: list[tuple[str, list[float], list[float]]] = [
            (
                "llm+gates",
                [v for r in group for v in r.llm_gate_us[:tenth]],
                [v for r in group for v in r.llm_gate_us[-tenth:]],
            ),
            (
                "full loop",
                [v for r in group for v in r.loop_us[:tenth]],
                [v for r in group for v in r.loop_us[-tenth:]],
            ),
        ]
        for label, first, last in measures:
            fmean, fmed = statistics.fmean(first), statistics.median(first)
            lmean, lmed = statistics.fmean(last), statistics.median(last)
            print(
                f"{store:<8}{label:<11}{fmean:>11.1f}{fmed:>10.1f}{lmean:>10.1f}{lmed:>9.1f}"
                f"{lmean / fmean:>11.2f}{lmed / fmed:>10.2f}"
            )
        overall = statistics.median(r.us_per_turn for r in group)
        print(f"{store:<8}{'overall':<11}{overall:>11.1f}  (wall time / N, median run)")
        slow = [[v for v in r.loop_us if v > SLOW_TURN_US] for r in group]
        count = statistics.median(len(s) for s in slow)
        share = statistics.median(
            sum(s) / (r.wall_s * 1e6) for s, r in zip(slow, group, strict=True)
        )
        print(
            f"{store:<8}{'slow turns':<11}{count:>11.0f}  per run over "
            f"{SLOW_TURN_US / 1000:.0f} ms (median), {share:.0%} of the wall time"
        )
    print(
        "llm+gates = Turn.metadata.duration_ms (LLM query + gate execution only); "
        "full loop = start-to-start interval of consecutive turns"
    )
    print()


def profile(n: int = FLATNESS_N, top: int = 30) -> None:
    """cProfile one in-memory cast of ``n`` turns; print top functions two ways.

    The cyclic GC is off while profiling: a collection is charged to whichever
    function happened to allocate when it triggered (one gen-2 pass of ~14 ms
    once showed up as the "own time" of ``Gate.validate``). GC cost is reported
    separately by the table.
    """
    spell = make_cantrip(n, cantrip.Loom())
    profiler = cProfile.Profile()

    async def cast() -> cantrip.CastResult:
        gc.collect()
        gc.disable()
        profiler.enable()
        try:
            return await spell.cast_async("benchmark the loop")
        finally:
            profiler.disable()
            gc.enable()

    trio.run(cast)
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats(key).print_stats(top)
        print(f"=== cProfile, memory loom, N={n}, GC off, sorted by {key} ===")
        print(out.getvalue())


def tracing_overhead(n: int = FLATNESS_N, repeats: int = 5) -> None:
    """Per-turn cost of OpenTelemetry tracing: off, events only, and spans.

    "off" is what every user without a tracer provider runs (the loop emits no
    events); "events only" adds an event sink that drops everything (what any
    streaming front end costs); "otel spans" traces every turn with the SDK and
    a processor that drops finished spans, so the figure is cantrip's and the
    SDK's span work, not an exporter's I/O.
    """
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
        from opentelemetry.sdk.trace.export import SpanExportResult as Result
    except ImportError:
        print(
            "tracing overhead: opentelemetry-sdk is not installed "
            "(pip install 'cantrip-runtime[otel]')"
        )
        return
    from cantrip.tracing._sink import TraceSink

    class Drop(SpanExporter):
        def export(self, spans: Any) -> Result:
            return Result.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    tracer = provider.get_tracer("bench")

    def nothing(event: Any) -> None:
        return None

    def timed(mode: str) -> float:
        spell = make_cantrip(n, cantrip.Loom())
        sink: Any = None
        if mode == "events only":
            sink = nothing
        elif mode == "otel spans":
            sink = TraceSink(tracer, spell.loom)

        async def cast() -> float:
            started = time.perf_counter()
            await spell.cast_async("benchmark the loop", on_event=sink)
            return time.perf_counter() - started

        return trio.run(cast) / n * 1e6

    modes = ("off", "events only", "otel spans")
    for mode in modes:
        timed(mode)  # warm-up
    results = {mode: [] for mode in modes}  # type: dict[str, list[float]]
    for _ in range(repeats):
        for mode in modes:  # interleaved, so drift hits every mode alike
            gc.collect()
            results[mode].append(timed(mode))
    print(f"Tracing overhead, memory loom, N={n} (best / median of {repeats} runs, us/turn)")
    base = min(results["off"])
    for mode in modes:
        best, median = min(results[mode]), statistics.median(results[mode])
        print(f"  {mode:<12}{best:>8.1f}{median:>10.1f}   +{best - base:.1f} us/turn vs off")
    print()


def _passes(value: Any) -> None:
    """A function guardrail that looks at its value and lets it by (the cheapest real check)."""
    return None


def guardrail_overhead(n: int = FLATNESS_N, repeats: int = 5) -> None:
    """Per-turn cost of guardrails (issue 43): none, one function guardrail on ``call``
    (every turn of the script makes one call), and one on each of the four places
    (input, output, call, result). Memory loom, interleaved runs. CPU time of this
    process (``time.process_time``), not wall time: on a shared machine the wall time
    of a 30 us turn is mostly other processes' (the loop is one thread, with nothing
    to wait for: a zero-latency LLM)."""
    modes: dict[str, tuple[cantrip.Guardrail, ...]] = {
        "none": (),
        "one on call": (cantrip.guardrail(_passes, on="call"),),
        "one on all four": (cantrip.guardrail(_passes, on=("input", "output", "call", "result")),),
    }

    def timed(rails: tuple[cantrip.Guardrail, ...]) -> float:
        spell = cantrip.Cantrip(
            llm=cantrip.ScriptedLLM(script(n)),  # type: ignore[arg-type]
            identity=cantrip.Identity(),
            circle=cantrip.Circle(
                [gates.done, gates.echo], [cantrip.max_turns(n + 1)], guardrails=rails
            ),
            loom=cantrip.Loom(),
        )

        async def cast() -> float:
            started = time.process_time()
            result = await spell.cast_async("benchmark the loop")
            assert result.terminated and len(result.turns) == n, result.reason
            return time.process_time() - started

        return trio.run(cast) / n * 1e6

    for rails in modes.values():
        timed(rails)  # warm-up
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode, rails in modes.items():  # interleaved, so drift hits every mode alike
            gc.collect()
            results[mode].append(timed(rails))
    print(f"Guardrail overhead, memory loom, N={n} (best / median of {repeats} runs, CPU us/turn)")
    base = min(results["none"])
    for mode in modes:
        best, median = min(results[mode]), statistics.median(results[mode])
        print(f"  {mode:<16}{best:>8.1f}{median:>10.1f}   +{best - base:.1f} us/turn vs none")
    print()


def classifier_latency(repeats: int = 5, model_s: float = 0.05, judge_s: float = 0.02) -> None:
    """Extra latency of an LLM classifier on the input (issue 43): a one-turn cast whose
    model takes ``model_s`` to answer, with no check, with a classifier (its model takes
    ``judge_s``) beside the model call, and with the same classifier blocking."""
    from cantrip.guardrails import classifier

    def judge() -> cantrip.Cantrip:
        return cantrip.Cantrip(
            llm=cantrip.ScriptedLLM([{"content": "pass"}], per_entity=True, latency_s=judge_s),
            identity=cantrip.Identity(system_prompt="pass or trip"),
            circle=cantrip.Circle([gates.done], [cantrip.max_turns(2)]),
        )

    modes: dict[str, tuple[cantrip.Guardrail, ...]] = {
        "no check": (),
        "classifier beside": (classifier(judge()),),
        "classifier blocking": (classifier(judge(), blocking=True),),
    }

    def timed(rails: tuple[cantrip.Guardrail, ...]) -> float:
        spell = cantrip.Cantrip(
            llm=cantrip.ScriptedLLM(script(1), latency_s=model_s),  # type: ignore[arg-type]
            identity=cantrip.Identity(),
            circle=cantrip.Circle([gates.done], [cantrip.max_turns(2)], guardrails=rails),
            loom=cantrip.Loom(),
        )

        async def cast() -> float:
            started = time.perf_counter()
            result = await spell.cast_async("is this fine?")
            assert result.terminated, result.reason
            return time.perf_counter() - started

        return trio.run(cast) * 1e3

    results: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode, rails in modes.items():
            results[mode].append(timed(rails))
    print(
        f"LLM classifier on input: model {model_s * 1e3:.0f} ms, classifier's model "
        f"{judge_s * 1e3:.0f} ms (best / median of {repeats} one-turn casts, ms)"
    )
    base = min(results["no check"])
    for mode in modes:
        best, median = min(results[mode]), statistics.median(results[mode])
        print(f"  {mode:<20}{best:>8.2f}{median:>9.2f}   +{best - base:.2f} ms vs no check")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5, help="runs per configuration")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="turns per cast")
    parser.add_argument(
        "--stores", nargs="+", choices=STORES, default=list(STORES), help="looms to compare"
    )
    parser.add_argument("--profile", action="store_true", help="also cProfile memory, N=1000")
    parser.add_argument(
        "--tracing", action="store_true", help="only the OpenTelemetry tracing comparison"
    )
    parser.add_argument(
        "--guardrails",
        action="store_true",
        help="only the guardrail comparisons (a function check; an LLM classifier)",
    )
    args = parser.parse_args(argv)
    if args.tracing:
        tracing_overhead(repeats=args.repeats)
        return 0
    if args.guardrails:
        guardrail_overhead(repeats=args.repeats)
        classifier_latency(repeats=args.repeats)
        return 0

    stores: list[Store] = args.stores
    sizes: list[int] = args.sizes
    for store in stores:  # first-call costs (lazy imports, caches): not what we measure
        run_once(store, 10)
    runs: dict[tuple[Store, int], list[Run]] = {}
    for store in stores:
        for n in sizes:
            runs[(store, n)] = []
            for _ in range(args.repeats):
                gc.collect()
                runs[(store, n)].append(run_once(store, n))

    print(f"python {sys.version.split()[0]}, trio {trio.__version__}")
    print()
    print_table(runs, args.repeats)
    print_fit(runs)
    print_flatness(runs)
    tracing_overhead(repeats=args.repeats)
    guardrail_overhead(repeats=args.repeats)
    classifier_latency(repeats=args.repeats)
    if args.profile:
        profile()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
