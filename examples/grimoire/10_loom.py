"""A.10 Loom -- inspect, fork and export what a run recorded.

    python examples/grimoire/10_loom.py

What to notice: every turn is in an append-only tree (LOOM-3) on disk;
threads are implicit -- follow parent links from a leaf to the root. The loom
says which threads terminated and which were truncated (LOOM-7). Forking from
a turn gives two threads that share a prefix and then diverge -- the shape
comparative RL needs: fork, rank, learn (6.4). Deleting a turn is refused;
a reward is the one annotation allowed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio
from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import LoomAppendOnlyError
from cantrip.loom._export import export_jsonl
from gates import done, echo

path = Path(tempfile.mkdtemp(prefix="loom-")) / "support.db"
loom = cantrip.Loom.open(path)  # SQLite: one commit per turn, readable by other processes

spell = cantrip.Cantrip(
    llm=choose_llm(
        [
            {"tool_calls": [{"gate": "echo", "args": {"text": "Order 4411: shipped Monday"}}]},
            {"content": "Your order shipped on Monday. (My key is sk-proj-EXAMPLEonly000000.)"},
        ]
    ),
    identity=cantrip.Identity(system_prompt="You answer customer questions about orders."),
    circle=cantrip.Circle([echo, done], [cantrip.max_turns(2), cantrip.require_done_tool(True)]),
    loom=loom,
)
# require_done_tool: the text reply does not end the loop, so max_turns truncates it.
first = spell.cast("Where is my order 4411?")
print("first cast:", "terminated" if first.terminated else f"truncated ({first.reason})")

# Fork from turn 1: the same prefix, a different continuation (another LLM).
# The fork replays turn 1 from the loom; no gate runs again (LOOM-13).
other = choose_llm(
    [
        {
            "tool_calls": [
                {"gate": "done", "args": {"answer": "Shipped Monday; it arrives Thursday."}}
            ]
        }
    ],
    name="other",
)
turn_one = first.turns[0]
forked_spell = spell.with_(llms={"other": other})


async def fork_and_continue() -> cantrip.CastResult:
    async with forked_spell.fork(turn_one, llm="other") as entity:
        return await entity.send("Where is my order 4411? Include the delivery day.")


second = trio.run(fork_and_continue)
print("forked cast:", second.result)

# Threads: root-to-leaf paths. Both start at turn 1 and diverge after it.
for thread in loom.threads():
    ends = thread[-1]
    state = "terminated" if ends.terminated else "truncated" if ends.truncated else "open"
    print(f"thread of {len(thread)} turn(s) from {thread[0].id[:13]}: {state} ({ends.reason})")

# The one allowed change: a reward on a turn (for ranking threads) ...
loom.annotate_reward(second.turns[-1].id, 1.0)
loom.annotate_reward(first.turns[-1].id, 0.0)
# ... and the refused one: the record is append-only.
try:
    loom.delete_turn(turn_one.id)
except LoomAppendOnlyError as error:
    print("refused:", error)

# A default export redacts secrets (PROD-8): the key in the reply does not leave.
exported = export_jsonl(loom)
print("export lines:", len(exported.splitlines()), "| key redacted:", "sk-proj-" not in exported)

print_loom(loom, f"the loom at {path.name}")
loom.close()
reopened = cantrip.Loom.open(path)  # another process could do the same
print(
    "reopened from disk:",
    len(reopened),
    "turns; rewards:",
    [reopened.reward(t.id) for t in reopened.turns if reopened.reward(t.id) is not None],
)
reopened.close()
