"""Instructions per turn over real sockets: a figure the machine's load cannot blur.

CPU time per turn (``bench/realsocket.py``) moves by 10-20% with what else runs on a
shared machine, more than most single changes to the hot path. This counts the
client's instructions instead, under valgrind (``cachegrind`` without the cache
simulation; the loopback server is a child process valgrind does not follow), for
two sizes of the 1,000-agents phase, and divides the difference by the turns between
them: imports, the warm-up and the one-agent phases cancel out.

    python bench/instructions.py [--low 100] [--high 500] [--turns 5]

``--tracing`` counts instead what OpenTelemetry tracing adds to a turn of
``bench/turn_overhead.py``'s in-memory cast (a zero-latency scripted LLM, one ``echo``
call a turn): instructions per turn with tracing off, with an event sink that drops
everything ("events only") and with cantrip's span sink on the SDK ("otel spans"), each
from two casts (``--low`` and ``--high`` turns) so the start-up cancels out::

    python bench/instructions.py --tracing [--low 50] [--high 450]

It imports ``cantrip`` and ``bench/turn_overhead.py`` from the current directory, so an
older checkout is measured by running this file there: ``cd OLD && PYTHONPATH=. python
NEW/bench/instructions.py --tracing``.

Needs ``valgrind`` on the PATH. Runs for about a minute (valgrind runs Python ~15x
slower). Compare two commits by running it in each checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def instructions(agents: int, turns: int) -> int:
    """The client process's instructions for a whole ``realsocket.py`` run."""
    return count(
        [
            sys.executable,
            str(HERE / "realsocket.py"),
            *("--gc", "cantrip", "--agents", str(agents), "--turns", str(turns)),
            *("--history", "10", "--sequential-turns", "10"),
        ]
    )


TRACED_CAST = """
import sys
import trio
sys.path[:0] = ["", "bench"]
import cantrip
import turn_overhead
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
try:
    from cantrip.tracing._sink import TraceSink
except ImportError:  # before the tracing package (af48c4a and older)
    from cantrip._tracing import TraceSink

class Drop(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

mode, turns = sys.argv[1], int(sys.argv[2])
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(Drop()))
spell = turn_overhead.make_cantrip(turns, cantrip.Loom())
sink = {"off": None, "events": lambda event: None}.get(mode)
if mode == "spans":
    sink = TraceSink(provider.get_tracer("bench"), spell.loom)
trio.run(lambda: spell.cast_async("benchmark the loop", on_event=sink))
"""
"""One in-memory cast of ``turns`` turns, traced as ``mode`` says (off, events, spans)."""


def count(command: list[str], env: dict[str, str] | None = None) -> int:
    """Instructions ``command`` runs under valgrind."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            *command,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def tracing(low: int, high: int) -> None:
    """Instructions per turn off / events only / otel spans, and what each adds."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every run

    def per_turn(mode: str) -> int:
        # Once without valgrind first: a module compiled during one of the two counted
        # runs (no .pyc yet in a fresh checkout) would be charged to the turns.
        subprocess.run([sys.executable, "-c", TRACED_CAST, mode, "2"], env=env, check=True)
        runs = [count([sys.executable, "-c", TRACED_CAST, mode, str(n)], env) for n in (low, high)]
        return (runs[1] - runs[0]) // (high - low)

    off = per_turn("off")
    print(f"instructions per turn ({low} -> {high} turns, memory loom):")
    print(f"  off          {off:>10,}")
    for mode, label in (("events", "events only"), ("spans", "otel spans")):
        figure = per_turn(mode)
        print(f"  {label:<12} {figure:>10,}   +{figure - off:,} vs off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--low", type=int, help="agents in the smaller run (100; --tracing: turns, 50)"
    )
    parser.add_argument(
        "--high", type=int, help="agents in the larger run (500; --tracing: turns, 450)"
    )
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument(
        "--tracing", action="store_true", help="OpenTelemetry tracing's cost per turn instead"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    if args.tracing:
        tracing(args.low or 50, args.high or 450)
        return
    args.low, args.high = args.low or 100, args.high or 500
    low = instructions(args.low, args.turns)
    high = instructions(args.high, args.turns)
    per_turn = (high - low) / ((args.high - args.low) * args.turns)
    print(
        f"client instructions per turn ({args.low} -> {args.high} agents x {args.turns} turns): "
        f"{per_turn:,.0f}"
    )


if __name__ == "__main__":
    main()
