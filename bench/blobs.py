"""Big values stored once: a loom's size after one cast reads the same 1 MiB result
100 times, on SQLite, JSONL and (with --pg URL) PostgreSQL, and how long exporting it
takes (every value inline, every string redacted on the way out).

    python bench/blobs.py [--times N] [--pg postgresql://...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

import cantrip
from cantrip import Cantrip, Circle, Identity, Loom, ScriptedLLM, max_turns
from cantrip.loom import export_jsonl
from gates import done

BIG = "0123456789abcdef" * (1024 * 1024 // 16)


def reader(loom: Loom, times: int) -> Cantrip:
    @cantrip.gate(name="read_big")
    def read_big() -> str:
        return BIG

    script = [{"tool_calls": [{"gate": "read_big", "args": {}}]} for _ in range(times)]
    script.append({"tool_calls": [{"gate": "done", "args": {"answer": "ok"}}]})
    return Cantrip(
        llm=ScriptedLLM(script),
        identity=Identity(system_prompt="Reader."),
        circle=Circle([done, read_big], [max_turns(times + 2)]),
        loom=loom,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=100)
    parser.add_argument("--pg", help="also a PostgreSQL database URL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".db", ".jsonl"):
            path = Path(tmp) / f"loom{suffix}"
            loom = Loom.open(path)
            started = time.perf_counter()
            trio.run(reader(loom, args.times).cast_async, "read it")
            loom.close()
            took = time.perf_counter() - started
            size = sum(p.stat().st_size for p in Path(tmp).glob(f"loom{suffix}*"))
            print(f"{suffix[1:]}: {args.times} x 1 MiB -> {size / 1e6:.2f} MB in {took:.2f} s")
            again = Loom.open(path)
            started = time.perf_counter()
            exported = export_jsonl(again)
            took = time.perf_counter() - started
            again.close()
            print(f"  export: {len(exported) / 1e6:.0f} MB of JSONL in {took:.2f} s")
    if args.pg:
        import psycopg

        loom = Loom.open(args.pg)
        trio.run(reader(loom, args.times).cast_async, "read it")
        loom.close()
        with psycopg.connect(args.pg) as conn:
            row = conn.execute(
                "SELECT pg_total_relation_size('cantrip_turns') + "
                "coalesce(pg_total_relation_size(to_regclass('cantrip_blobs')), 0)"
            ).fetchone()
        assert row is not None
        print(f"postgresql: {args.times} x 1 MiB -> {row[0] / 1e6:.2f} MB (turns + blobs)")


if __name__ == "__main__":
    main()
