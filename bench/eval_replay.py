"""Replaying recorded eval cases: how long 1,000 cases take offline (target < 10 s).

Records N cases of a two-turn greeter (echo, then done) into a JSONL loom once,
then replays the suite from it: opening the recording, indexing every answer by
its conversation, and running every case with its evaluators. Prints the figures.

    python bench/eval_replay.py [N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip.evals import Case, Expect, ReplayIndex, ReplayLLM, Suite, run_suite
from gates import done, echo


def spell_for(loom: Loom) -> Cantrip:
    return Cantrip(
        llm=ScriptedLLM(
            [
                {"tool_calls": [{"gate": "echo", "args": {"text": "Hello, world!"}}]},
                {"tool_calls": [{"gate": "done", "args": {"answer": "I greeted the world."}}]},
            ]
        ),
        identity=Identity(system_prompt="You are a friendly greeter."),
        circle=Circle([done, echo], [max_turns(5)]),
        loom=loom,
    )


def suite_of(n: int) -> Suite:
    expect = Expect(result_contains="greeted", gates=["echo", "done"], max_turns=3)
    return Suite(
        [Case(name=f"case-{i}", intent=f"Greet visitor {i}.", expect=expect) for i in range(n)]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    suite = suite_of(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        recording = Path(tmp) / "recording.jsonl"
        started = time.perf_counter()
        recorded = trio.run(
            lambda: run_suite(
                suite, cantrip=spell_for, record=recording, concurrency=args.concurrency
            )
        )
        record_s = time.perf_counter() - started
        assert recorded.passed
        size = recording.stat().st_size

        started = time.perf_counter()
        loom = Loom.open(recording)
        index = ReplayIndex.from_loom(loom)
        index_s = time.perf_counter() - started

        cpu0, wall0 = time.process_time(), time.perf_counter()
        replayed = trio.run(
            lambda: run_suite(
                suite,
                cantrip=spell_for,
                replay=ReplayLLM(index),
                concurrency=args.concurrency,
            )
        )
        run_s, run_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        assert replayed.passed, [r.why for r in replayed.runs if r.status != "passed"][:3]
    total = index_s + run_s
    print(f"cases: {args.n}, concurrency {args.concurrency}")
    print(f"record (scripted LLM, JSONL loom): {record_s:.2f} s; recording {size / 1e6:.1f} MB")
    print(f"open + index the recording: {index_s:.2f} s ({len(index)} answers)")
    print(
        f"replay every case: {run_s:.2f} s wall, {run_cpu:.2f} s CPU "
        f"({run_s / args.n * 1000:.2f} ms per case)"
    )
    print(f"replay total (open, index, run): {total:.2f} s  (target < 10 s)")


if __name__ == "__main__":
    main()
