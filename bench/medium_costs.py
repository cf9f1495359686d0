"""Sandbox costs of the code mediums: start-up per entity and per-turn execution overhead.

What it measures
----------------
For each code medium that can be imported -- always the JavaScript medium
(``mediums.js.JsMedium``); the Python (``mediums.python.PythonMedium``) and
bash (``mediums.bash.BashMedium``) mediums only if their modules exist when the
script runs -- through the medium protocol every entity uses (``medium.open``
-> ``session.execute`` -> ``session.aclose``), with the circle
``Circle([done, echo], [max_turns(10)], medium)`` as the gate host:

* **start-up** -- a fresh session per sample: the wall time of its first
  ``execute`` of a trivial snippet (which starts the sandbox: worker process,
  interpreter, gate bindings) minus the median of the next
  ``WARM_SAMPLES`` trivial executes of the same session, i.e. what the first
  turn of an entity costs on top of an ordinary turn. ``first`` is that first
  execute alone, ``close`` the ``aclose`` (killing and reaping the sandbox).
* **1-turn cast** -- end to end through the public API: ``cast_async`` of a
  one-turn script whose code calls ``done``, with a zero-latency
  :class:`cantrip.ScriptedLLM` (summon, start, one turn, close), and the same
  minus the median of an identical cast in the conversation medium (a plain
  ``done`` tool call): the sandbox's whole per-entity price.
* **per-turn overhead** -- one warm session per medium and snippet, ``--turns``
  executes after ``WARMUP`` unmeasured ones, for a trivial snippet (``1 + 1``)
  and for a snippet that makes 10 ``echo`` gate calls (so the difference / 10
  is the cost of one host-function round trip, gate validation and recording
  included). Every execute is checked: the trivial one must report no error,
  the gate one exactly 10 ``echo`` records, all ``ok``.
* **loop turn** -- ``Turn.metadata.duration_ms`` (LLM query + execute) of the
  turns 2..N of a cast of trivial snippets: the per-turn cost as the loop sees
  it.

* **cancel latency** (issue 13, item 4) -- a runaway snippet (``while true``)
  in a session whose own time limit is 60 s, cut off by a trio cancel scope
  deadline 100 ms after it started: the time from the deadline until
  ``execute`` has returned (worker killed and reaped), p50 and max over
  ``--cancels`` fresh sessions. ``own limit`` is the same runaway code ended by
  the medium's own ``max_eval_ms`` (200 ms): how long past that limit it ends.
  The row ``gate thread`` is a blocking gate (``@gate(blocking=True)``)
  running in a worker thread, cancelled the same way.

Every figure is reported as median and p95 (nearest rank) over the samples.
Targets (from the issue): start-up <= 100 ms; trivial turn <= 2 ms (JS),
<= 1 ms (Python). The bash medium has no stated target.

How to run
----------
From the repository root::

    python bench/medium_costs.py                      # every medium found
    python bench/medium_costs.py --mediums js         # only some
    python bench/medium_costs.py --starts 50 --turns 1000
    python bench/medium_costs.py --only-cancel        # just the cancel latencies

If a medium's snippets stop fitting it (its gate conventions change), or the
medium raises, the script says so and shows the observation or the error
instead of a number for what it could not measure.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

import cantrip
import gates
from cantrip import Circle, Response, ToolCall, max_turns
from mediums.base import Execution, Medium
from mediums.js import JsMedium

WARM_SAMPLES = 5
WARMUP = 20
TARGET_START_MS = 100.0
TARGET_TURN_MS: dict[str, float] = {"js": 2.0, "python": 1.0}


@attrs.frozen
class Snippets:
    trivial: str
    ten_echoes: str
    done: str


SNIPPETS: dict[str, Snippets] = {
    "js": Snippets("1 + 1", "for (var i = 0; i < 10; i++) echo('hi');", "done(1)"),
    "python": Snippets("1 + 1", "for i in range(10):\n    echo('hi')", "done(1)"),
    # Gates are shell commands: ``cantrip_gate NAME ARG...`` (``echo`` is a builtin);
    # done is ``submit_answer`` (``done`` is a keyword).
    "bash": Snippets(
        "echo $((1 + 1))",
        "for i in 1 2 3 4 5 6 7 8 9 10; do cantrip_gate echo hi; done",
        "submit_answer 1",
    ),
}


RUNAWAY: dict[str, str] = {
    "js": "while (true) {}",
    "python": "while True:\n    pass",
    "bash": "while :; do :; done",
}
RUN_BEFORE_CANCEL_S = 0.1
OWN_LIMIT_MS = 200


def available_mediums(wanted: Sequence[str]) -> tuple[dict[str, Medium], list[str]]:
    """The mediums that import, and a note for each one that does not."""
    factories: dict[str, Callable[[], Medium]] = {"js": JsMedium}
    notes: list[str] = []
    try:
        from mediums.python import PythonMedium

        factories["python"] = PythonMedium
    except ModuleNotFoundError:
        notes.append("python: mediums.python does not exist (yet); skipped")
    except Exception as exc:  # noqa: BLE001 -- a half-written module must not stop the bench
        notes.append(f"python: mediums.python failed to import ({exc!r}); skipped")
    try:
        from mediums.bash import BashMedium  # type: ignore[import-not-found,unused-ignore]

        factories["bash"] = BashMedium
    except ModuleNotFoundError:
        notes.append("bash: mediums.bash does not exist (yet); skipped")
    except Exception as exc:  # noqa: BLE001
        notes.append(f"bash: mediums.bash failed to import ({exc!r}); skipped")
    found = {name: make() for name, make in factories.items() if name in wanted}
    return found, notes


# -- helpers ---------------------------------------------------------------------


class SnippetFailed(Exception):
    """A snippet did not do what the measurement assumes."""


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def code_argument(medium: Medium, circle: Circle) -> tuple[str, str]:
    """(tool name, argument name) of the medium's one code tool."""
    [tool] = medium.present(circle.gates)
    required = list(tool.parameters.get("required") or tool.parameters["properties"])
    return tool.name, required[0]


class Runner:
    """Executes snippets in one medium the way the entity loop does."""

    def __init__(self, medium: Medium) -> None:
        self.medium = medium
        self.circle = Circle([gates.done, gates.echo], [max_turns(10)], medium)
        self.tool, self.argument = code_argument(medium, self.circle)
        self._ids = 0

    def response(self, code: str) -> Response:
        self._ids += 1
        return Response(
            tool_calls=(ToolCall(f"call-{self._ids}", self.tool, {self.argument: code}),)
        )

    async def execute(self, session: Any, code: str) -> tuple[float, Execution]:
        response = self.response(code)
        started = time.perf_counter()
        execution = await session.execute(response, self.circle)
        return time.perf_counter() - started, execution


def check_trivial(execution: Execution) -> None:
    if "error" in execution.observation.lower() or execution.gate_calls:
        raise SnippetFailed(f"trivial snippet failed: {execution.observation!r}")


def check_echoes(execution: Execution) -> None:
    calls = [(r.gate, r.status) for r in execution.gate_calls]
    if calls != [("echo", "ok")] * 10:
        raise SnippetFailed(
            f"gate snippet made {len(calls)} call(s) {calls[:3]}..., not 10 ok echo calls: "
            f"{execution.observation[:300]!r}"
        )


# -- measurements --------------------------------------------------------------------


@attrs.define
class Figures:
    first_ms: list[float] = attrs.field(factory=list)
    start_ms: list[float] = attrs.field(factory=list)
    close_ms: list[float] = attrs.field(factory=list)
    cast_ms: list[float] = attrs.field(factory=list)
    trivial_ms: list[float] = attrs.field(factory=list)
    echoes_ms: list[float] = attrs.field(factory=list)
    loop_ms: list[float] = attrs.field(factory=list)
    cancel_ms: list[float] = attrs.field(factory=list)
    own_limit_ms: list[float] = attrs.field(factory=list)
    problem: str | None = None


async def measure_start(runner: Runner, snippets: Snippets, starts: int, figures: Figures) -> None:
    for _ in range(starts):
        session = await runner.medium.open(runner.circle.resolved)
        try:
            first, execution = await runner.execute(session, snippets.trivial)
            check_trivial(execution)
            warm = []
            for _ in range(WARM_SAMPLES):
                elapsed, execution = await runner.execute(session, snippets.trivial)
                check_trivial(execution)
                warm.append(elapsed)
        finally:
            closing = time.perf_counter()
            await session.aclose()
            figures.close_ms.append((time.perf_counter() - closing) * 1000)
        figures.first_ms.append(first * 1000)
        figures.start_ms.append((first - statistics.median(warm)) * 1000)


async def measure_turns(runner: Runner, snippets: Snippets, turns: int, figures: Figures) -> None:
    for code, check, sink in (
        (snippets.trivial, check_trivial, figures.trivial_ms),
        (snippets.ten_echoes, check_echoes, figures.echoes_ms),
    ):
        session = await runner.medium.open(runner.circle.resolved)
        try:
            for index in range(WARMUP + turns):
                elapsed, execution = await runner.execute(session, code)
                check(execution)
                if index >= WARMUP:
                    sink.append(elapsed * 1000)
        finally:
            await session.aclose()


def one_turn_cast(medium: Medium | None, code: str | None) -> cantrip.Cantrip:
    """A cantrip whose single turn calls done: by code, or as a tool call."""
    entry: dict[str, Any] = (
        {"code": code}
        if code is not None
        else {"tool_calls": [{"gate": "done", "args": {"answer": 1}}]}
    )
    circle = (
        Circle([gates.done, gates.echo], [max_turns(10)], medium)
        if medium is not None
        else Circle([gates.done, gates.echo], [max_turns(10)])
    )
    return cantrip.Cantrip(
        llm=cantrip.ScriptedLLM([entry]), identity=cantrip.Identity(), circle=circle
    )


async def time_cast(spell: cantrip.Cantrip) -> float:
    started = time.perf_counter()
    result = await spell.cast_async("benchmark")
    elapsed = time.perf_counter() - started
    if not (result.terminated and str(result.result) == "1"):  # bash answers "1"
        raise SnippetFailed(
            f"one-turn cast did not end with done(1): {result.turns[-1].observation!r}"
        )
    return elapsed * 1000


async def measure_casts(medium: Medium, snippets: Snippets, starts: int, figures: Figures) -> None:
    for _ in range(starts):
        figures.cast_ms.append(await time_cast(one_turn_cast(medium, snippets.done)))


async def measure_loop(medium: Medium, snippets: Snippets, turns: int, figures: Figures) -> None:
    n = min(turns, 200) + 1
    script = [{"code": snippets.trivial}] * (n - 1) + [{"code": snippets.done}]
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=Circle([gates.done, gates.echo], [max_turns(n + 1)], medium),
    )
    result = await spell.cast_async("benchmark the loop")
    if not result.terminated or len(result.turns) != n:
        raise SnippetFailed(f"loop cast ended early: {result.turns[-1].observation!r}")
    figures.loop_ms.extend(t.metadata.duration_ms for t in result.turns[1:-1])


async def conversation_baseline(starts: int) -> list[float]:
    return [await time_cast(one_turn_cast(None, None)) for _ in range(starts)]


async def measure(name: str, medium: Medium, starts: int, turns: int) -> Figures:
    figures = Figures()
    snippets = SNIPPETS[name]
    runner = Runner(medium)
    try:
        await measure_start(runner, snippets, 2, Figures())  # warm caches and imports
        await measure_start(runner, snippets, starts, figures)
        await measure_casts(medium, snippets, starts, figures)
        await measure_turns(runner, snippets, turns, figures)
        await measure_loop(medium, snippets, turns, figures)
    except SnippetFailed as exc:
        figures.problem = str(exc)
    except Exception as exc:  # noqa: BLE001 -- one broken medium must not hide the others
        figures.problem = f"the medium raised {exc!r}"
    return figures


async def cancel_latency(medium: Medium, name: str, samples: int) -> list[float]:
    """ms from a cancel scope's deadline until a runaway ``execute`` has returned."""
    runner = Runner(attrs.evolve(medium, max_eval_ms=60_000))  # type: ignore[misc]
    latencies = []
    for _ in range(samples):
        session = await runner.medium.open(runner.circle.resolved)
        try:
            _elapsed, execution = await runner.execute(session, SNIPPETS[name].trivial)
            check_trivial(execution)  # the sandbox is up: only the cut-off is timed
            with trio.CancelScope() as scope:
                scope.deadline = trio.current_time() + RUN_BEFORE_CANCEL_S
                await runner.execute(session, RUNAWAY[name])
            if not scope.cancelled_caught:
                raise SnippetFailed("the runaway snippet ended on its own")
            latencies.append((trio.current_time() - scope.deadline) * 1000)
        finally:
            await session.aclose()
    return latencies


async def own_limit_overshoot(medium: Medium, name: str, samples: int) -> list[float]:
    """ms past the medium's own ``max_eval_ms`` until a runaway ``execute`` returned."""
    runner = Runner(attrs.evolve(medium, max_eval_ms=OWN_LIMIT_MS))  # type: ignore[misc]
    overshoots = []
    for _ in range(samples):
        session = await runner.medium.open(runner.circle.resolved)
        try:
            await runner.execute(session, SNIPPETS[name].trivial)
            elapsed, execution = await runner.execute(session, RUNAWAY[name])
            if "error" not in execution.observation and "timed out" not in execution.observation:
                raise SnippetFailed(f"runaway code was not stopped: {execution.observation!r}")
            overshoots.append(elapsed * 1000 - OWN_LIMIT_MS)
        finally:
            await session.aclose()
    return overshoots


async def gate_thread_latency(samples: int) -> list[float]:
    """A blocking gate in a worker thread, cancelled: ms from the deadline to return."""
    release = threading.Event()

    @cantrip.gate(blocking=True)
    def wait_forever() -> str:
        """Blocks its thread until released."""
        release.wait(60)
        return "released"

    circle = Circle([gates.done, wait_forever], [max_turns(10)])
    latencies = []
    try:
        for _ in range(samples):
            with trio.CancelScope() as scope:
                scope.deadline = trio.current_time() + RUN_BEFORE_CANCEL_S
                await circle.call("wait_forever", {})
            latencies.append((trio.current_time() - scope.deadline) * 1000)
    finally:
        release.set()
    return latencies


async def measure_cancels(found: dict[str, Medium], samples: int) -> dict[str, Figures]:
    results = {}
    for name, medium in found.items():
        figures = Figures()
        try:
            figures.cancel_ms = await cancel_latency(medium, name, samples)
            figures.own_limit_ms = await own_limit_overshoot(medium, name, samples)
        except SnippetFailed as exc:
            figures.problem = str(exc)
        except Exception as exc:  # noqa: BLE001 -- one broken medium must not hide the others
            figures.problem = f"the medium raised {exc!r}"
        results[name] = figures
    results["gate thread"] = Figures(cancel_ms=await gate_thread_latency(samples))
    return results


def report_cancels(results: dict[str, Figures], samples: int) -> None:
    print(
        f"Cancel latency, ms after the deadline (p50 / max of {samples}; "
        "runaway code, medium limit 60 s; target ~100 ms)"
    )
    print()
    header = f"{'medium':<12}{'cancel p50':>12}{'cancel max':>12}{'own limit p50':>15}{'max':>8}"
    print(header)
    print("-" * len(header))

    def fmt(values: list[float], width: int) -> str:
        return f"{statistics.median(values):>{width}.1f}" if values else f"{'-':>{width}}"

    for name, f in results.items():
        top = f"{max(f.cancel_ms):>12.1f}" if f.cancel_ms else f"{'-':>12}"
        own_top = f"{max(f.own_limit_ms):>8.1f}" if f.own_limit_ms else f"{'-':>8}"
        print(f"{name:<12}{fmt(f.cancel_ms, 12)}{top}{fmt(f.own_limit_ms, 15)}{own_top}")
    print(f"own limit = ms past max_eval_ms={OWN_LIMIT_MS} until the runaway code call returned")
    for name, f in results.items():
        if f.problem:
            print(f"{name}: measurement incomplete -- {f.problem}")


# -- report ---------------------------------------------------------------------------


def cell(values: Sequence[float], width: int = 8) -> str:
    if not values:
        return f"{'-':>{width}}{'-':>{width}}"
    return f"{statistics.median(values):>{width}.2f}{p95(values):>{width}.2f}"


def report(results: dict[str, Figures], baseline: list[float], starts: int, turns: int) -> None:
    base = statistics.median(baseline)
    print(f"Start-up per entity, ms (median / p95 of {starts} fresh sessions; target <= 100 ms)")
    print()
    header = (
        f"{'medium':<8}{'start-up':>16}{'first execute':>16}{'close':>16}"
        f"{'1-turn cast':>16}{'cast - conv':>16}{'ok?':>6}"
    )
    print(header)
    print(f"{'':<8}" + f"{'med':>8}{'p95':>8}" * 5)
    print("-" * len(header))
    for name, f in results.items():
        extra = [v - base for v in f.cast_ms]
        verdict = "-"
        if f.start_ms:
            verdict = "yes" if statistics.median(f.start_ms) <= TARGET_START_MS else "NO"
        print(
            f"{name:<8}{cell(f.start_ms)}{cell(f.first_ms)}{cell(f.close_ms)}"
            f"{cell(f.cast_ms)}{cell(extra)}{verdict:>6}"
        )
    print(f"{'conv.':<8}{'':>48}{cell(baseline)}  (conversation medium, done tool call)")
    print()
    print(f"Per-turn execution overhead, ms (median / p95 of {turns} warm executes)")
    print()
    header = (
        f"{'medium':<8}{'1 + 1':>16}{'10 echo calls':>16}{'per gate call':>16}"
        f"{'loop turn':>16}{'target':>9}{'ok?':>6}"
    )
    print(header)
    print(f"{'':<8}" + f"{'med':>8}{'p95':>8}" * 2 + f"{'med':>16}" + f"{'med':>8}{'p95':>8}")
    print("-" * len(header))
    for name, f in results.items():
        per_call = "-"
        if f.trivial_ms and f.echoes_ms:
            delta = (statistics.median(f.echoes_ms) - statistics.median(f.trivial_ms)) / 10
            per_call = f"{delta:.3f}"
        target = TARGET_TURN_MS.get(name)
        verdict = "-"
        if target is not None and f.trivial_ms:
            verdict = "yes" if statistics.median(f.trivial_ms) <= target else "NO"
        target_text = f"<= {target:g}" if target is not None else "-"
        print(
            f"{name:<8}{cell(f.trivial_ms)}{cell(f.echoes_ms)}{per_call:>16}"
            f"{cell(f.loop_ms)}{target_text:>9}{verdict:>6}"
        )
    print(
        "loop turn = Turn.metadata.duration_ms of a cast of trivial snippets "
        "(zero-latency LLM query + execute)"
    )
    problems = [(name, f.problem) for name, f in results.items() if f.problem]
    if problems:
        print()
        for name, problem in problems:
            print(f"{name}: measurement incomplete -- {problem}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--starts", type=int, default=20, help="fresh sessions per medium")
    parser.add_argument("--turns", type=int, default=300, help="measured executes per snippet")
    parser.add_argument(
        "--mediums", nargs="+", default=list(SNIPPETS), choices=list(SNIPPETS), help="which"
    )
    parser.add_argument("--cancels", type=int, default=10, help="cut-offs per medium")
    parser.add_argument(
        "--only-cancel", action="store_true", help="measure only the cancel latencies"
    )
    args = parser.parse_args(argv)
    found, notes = available_mediums(args.mediums)
    if args.only_cancel:
        cancels = trio.run(measure_cancels, found, args.cancels)
        print(f"python {sys.version.split()[0]}, trio {trio.__version__}")
        print()
        report_cancels(cancels, args.cancels)
        return 0

    async def run() -> tuple[dict[str, Figures], list[float]]:
        baseline = await conversation_baseline(args.starts)
        results = {}
        for name, medium in found.items():
            gc.collect()
            results[name] = await measure(name, medium, args.starts, args.turns)
        return results, baseline

    results, baseline = trio.run(run)
    cancels = trio.run(measure_cancels, found, args.cancels)
    print(f"python {sys.version.split()[0]}, trio {trio.__version__}")
    for note in notes:
        print(note)
    print()
    report(results, baseline, args.starts, args.turns)
    print()
    report_cancels(cancels, args.cancels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
