"""How big a loom gets when a gate returns a huge result (issue 28, item 10).

What it measures
----------------
One cast of two turns: the first calls ``big(megabytes=M)`` on the test MCP server
``tests/mcp_servers/toolbox.py`` (official SDK, over stdio), which answers with a text
result of ``M`` million characters; the second calls ``done``. The loom is a JSONL file.
Printed: the loom file's size, the size of the ``big`` record's stored result, whether
the record says it was cut (``detail.result_cut``), and the cast's wall time.

How to run
----------
From the repository root::

    python bench/record_cap.py                 # M = 30
    python bench/record_cap.py --megabytes 5 --max-record-chars 65536
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# bench/mcp.py shares its name with the SDK's package: keep this folder off the
# import path, or ``import mcp`` would find that file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import trio  # noqa: E402

import cantrip  # noqa: E402
from cantrip.mcp import MCPServer  # noqa: E402
from gates import done  # noqa: E402

TOOLBOX = Path(__file__).resolve().parents[1] / "tests" / "mcp_servers" / "toolbox.py"


async def measure(megabytes: int, cap: int | None, folder: Path) -> None:
    path = folder / "loom.jsonl"
    wards = [cantrip.max_turns(3)]
    if cap is not None:
        wards.append(cantrip.Ward("max_record_chars", cap))
    server = MCPServer(name="tb", command=sys.executable, args=[str(TOOLBOX)], tools=["big"])
    script = [
        {"tool_calls": [{"gate": "tb_big", "args": {"megabytes": megabytes}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]},
    ]
    spell = cantrip.Cantrip(
        llm=cantrip.ScriptedLLM(script),
        identity=cantrip.Identity(),
        circle=cantrip.Circle([done], wards, providers=[server]),
        loom=cantrip.Loom.open(path),
    )
    started = time.perf_counter()
    await spell.cast_async("big")
    elapsed = time.perf_counter() - started
    spell.loom.close()
    loom = cantrip.Loom.open(path)  # big values (blobs) read back whole
    record = next(r for t in loom.turns for r in t.gate_calls if r.gate == "tb_big").to_dict()
    loom.close()
    cut = (record.get("detail") or {}).get("result_cut")
    print(f"result of {megabytes} MB from an MCP server, JSONL loom")
    print(f"  loom file           {path.stat().st_size / 1e6:10.2f} MB")
    print(f"  stored result       {len(record['result']) / 1e6:10.2f} M characters")
    print(f"  detail.result_cut   {json.dumps(cut) if cut else 'absent'}")
    print(f"  cast wall time      {elapsed:10.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=30)
    parser.add_argument("--max-record-chars", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trio.run(measure, args.megabytes, args.max_record_chars, Path(folder))


if __name__ == "__main__":
    main()
