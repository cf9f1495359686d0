"""Instructions per turn over real sockets: a figure the machine's load cannot blur.

CPU time per turn (``bench/realsocket.py``) moves by 10-20% with what else runs on a
shared machine, more than most single changes to the hot path. This counts the
client's instructions instead, under valgrind (``cachegrind`` without the cache
simulation; the loopback server is a child process valgrind does not follow), for
two sizes of the 1,000-agents phase, and divides the difference by the turns between
them: imports, the warm-up and the one-agent phases cancel out.

    python bench/instructions.py [--low 100] [--high 500] [--turns 5]

Needs ``valgrind`` on the PATH. Runs for about a minute (valgrind runs Python ~15x
slower). Compare two commits by running it in each checkout.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def instructions(agents: int, turns: int) -> int:
    """The client process's instructions for a whole ``realsocket.py`` run."""
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        str(HERE / "realsocket.py"),
        "--gc",
        "cantrip",
        "--agents",
        str(agents),
        "--turns",
        str(turns),
        "--history",
        "10",
        "--sequential-turns",
        "10",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--low", type=int, default=100, help="agents in the smaller run")
    parser.add_argument("--high", type=int, default=500, help="agents in the larger run")
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    low = instructions(args.low, args.turns)
    high = instructions(args.high, args.turns)
    per_turn = (high - low) / ((args.high - args.low) * args.turns)
    print(
        f"client instructions per turn ({args.low} -> {args.high} agents x {args.turns} turns): "
        f"{per_turn:,.0f}"
    )


if __name__ == "__main__":
    main()
