"""A.12 Familiar -- a persistent entity that builds and directs other cantrips.

    python examples/grimoire/12_familiar.py

What to notice: the familiar itself only observes (read-only gates on a
codebase) and delegates. Through code it constructs child cantrips at run
time, choosing each child's medium, gates, wards and LLM for the job: a
Python analyst that reads the code, a conversational writer. When a child is
cut off by the ward the familiar gave it, the truncation summary comes back
as data (not a failure), and the familiar tries again with more room. Its
loom is on disk: summoned again in a later session, it resumes with its
accumulated context -- and folding keeps that context bounded.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio
from _grimoire import choose_llm, print_loom

import cantrip
from cantrip._folding import FoldingPolicy
from gates import call_agent, done, read
from mediums import JsMedium

WORK = Path(tempfile.mkdtemp(prefix="familiar-"))
CODE = WORK / "code"
CODE.mkdir()
(CODE / "calc.py").write_text(
    "def add(a, b):\n    return a + b\n\n"
    "def divide(a, b):\n    return a / b\n\n"
    "def mean(xs):\n    return sum(xs) / len(xs)\n"
)
(CODE / "README.md").write_text("calc: tiny arithmetic helpers\n")
LOOM = WORK / "familiar.db"


@cantrip.gate(dependencies=("root",))
def list_files(root: Path) -> list[str]:
    """The files of the codebase (read-only)."""
    return sorted(p.name for p in root.iterdir())


# The children's LLMs, by name: the familiar picks one per child it builds.
CHILD_LLMS = {
    "analyst": [  # a Python analyst: first run is cut off, second finishes
        {"code": "src = read('calc.py')"},
        {"code": "src = read('calc.py')\n"
                 "funcs = [l[4:l.index('(')] for l in src.splitlines() if l.startswith('def ')]\n"
                 "funcs"},
        {"code": "done(funcs)"},
    ],
    "writer": [
        {"tool_calls": [{"gate": "done", "args": {
            "answer": "calc 1.1: add, divide and mean for everyday arithmetic."}}]},
    ],
}  # fmt: skip

FIRST_SESSION = [
    {"code": "var files = list_files(); files"},
    {  # build a child cantrip: Python medium, read + done, one turn only
        "code": "var attempt = call_agent({intent: 'List the names of the functions in calc.py',\n"
        "  medium: 'python', gates: ['read', 'done'], wards: [{max_turns: 1}], llm: 'analyst'});\n"
        "attempt"
    },
    {  # the summary said it ran out of turns: try again with more room
        "code": "var functions = call_agent({\n"
        "  intent: 'List the names of the functions in calc.py',\n"
        "  medium: 'python', gates: ['read', 'done'], wards: [{max_turns: 3}], llm: 'analyst'});\n"
        "functions"
    },
    {  # a different kind of child for a different job
        "code": "var note = call_agent({intent: 'Write a one-line release note for calc, whose "
        "functions are: ' + functions.join(', '), medium: 'conversation', gates: ['done'],\n"
        "  llm: 'writer'});\n"
        "done(note)"
    },
]
LATER_SESSION = [
    {"code": "done('Last time: ' + files.length + ' files; calc.py defines ' + "
             "functions.join(', ') + '; release note: ' + note)"},
]  # fmt: skip


def familiar(script: list[dict[str, str]]) -> cantrip.Cantrip:
    return cantrip.Cantrip(
        llm=choose_llm(script),
        identity=cantrip.Identity(
            system_prompt="You are a familiar: you look after a codebase. You can only read it; "
            "for any work, build a child with call_agent, choosing its medium, gates, wards and "
            "llm ('analyst' for code, 'writer' for prose). Finish with done(answer)."
        ),
        circle=cantrip.Circle(
            gates=[list_files.bind(root=CODE), read.bind(root=CODE), call_agent, done],
            wards=[cantrip.max_turns(10), cantrip.max_depth(1)],
            medium=JsMedium(),
        ),
        llms={name: choose_llm(s, name=name) for name, s in CHILD_LLMS.items()},
        loom=cantrip.Loom.open(LOOM),  # persisted: the familiar's long-term memory
        folding=FoldingPolicy(trigger_after_turns=8, keep_recent=2),
    )


async def main() -> None:
    spell = familiar(FIRST_SESSION)
    async with spell.summon() as entity:
        outcome = await entity.send("Prepare a release note for the calc module.")
        print("session 1:", outcome.result)
        familiar_id = entity.id
    cut = next(r for t in outcome.turns for r in t.gate_calls if r.detail.get("truncated"))
    print("a child was cut off by its ward; the familiar got:", str(cut.result)[:70], "...")
    spell.loom.close()

    spell = familiar(LATER_SESSION)  # a later session, e.g. a new process
    async with spell.resume(familiar_id) as entity:
        again = await entity.send("What did we do last time?")
        print("session 2:", again.result)
    print_loom(spell.loom)
    spell.loom.close()


if __name__ == "__main__":
    trio.run(main)
