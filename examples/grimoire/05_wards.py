"""A.5 Wards -- subtractive restrictions, composed by fixed rules.

    python examples/grimoire/05_wards.py

What to notice: stacked wards resolve by rule -- numbers by min, booleans by
OR (WARD-1) -- so adding a ward can only restrict. When depth reaches zero the
delegation gates are not forbidden, they are absent (COMP-6). And a ward is
outside the entity's context: an entity that never calls done is cut off
anyway (CIRCLE-6), and the caller gets a summary of what happened (LOOP-4).
"""

from __future__ import annotations

from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import WardSet
from gates import call_agent, done

# 1. Composition: three max_turns wards resolve to the smallest.
wards = WardSet.resolve([cantrip.max_turns(50), cantrip.max_turns(10), cantrip.max_turns(100)])
print("max_turns 50, 10, 100 resolve to:", wards.max_turns)

# ... and require_done_tool resolves by OR: once required, always required.
wards = WardSet.resolve([cantrip.require_done_tool(True), cantrip.require_done_tool(False)])
print("require_done_tool true, false resolve to:", wards.require_done_tool)

# 2. Depth: at max_depth 0 the delegation gate is structurally gone.
shallow = cantrip.Circle([done, call_agent], [cantrip.max_turns(5), cantrip.max_depth(0)])
deep = cantrip.Circle([done, call_agent], [cantrip.max_turns(5), cantrip.max_depth(2)])
print("gates at max_depth 2:", deep.gate_names, "| at max_depth 0:", shallow.gate_names)


# 3. The non-happy path: an entity that keeps checking and never finishes.
@cantrip.gate
def check_inbox() -> str:
    """Look for new messages."""
    return "no new messages"


circle = cantrip.Circle(
    gates=[check_inbox, done],
    wards=[
        cantrip.max_turns(20),
        cantrip.max_turns(3),  # the stricter ward wins: 3 turns
        cantrip.require_done_tool(True),  # a text reply does not end the loop either
    ],
)
spell = cantrip.Cantrip(
    llm=choose_llm(
        [{"tool_calls": [{"gate": "check_inbox", "args": {}}]}] * 2
        + [{"content": "Still nothing; I will keep waiting for the reply."}]
    ),
    identity=cantrip.Identity(system_prompt="You watch the inbox for a reply from the bank."),
    circle=circle,
)
outcome = spell.cast("Wait until the bank replies about the mortgage, then summarise its answer.")
print("\nterminated:", outcome.terminated, "| truncated:", outcome.truncated, "|", outcome.reason)
print("summary for the caller:", outcome.summary)
print_loom(spell.loom)
