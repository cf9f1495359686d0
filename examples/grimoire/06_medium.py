"""A.6 Medium -- the same kind of gates, a radically different action space.

    python examples/grimoire/06_medium.py

What to notice: A = M + G - W becomes concrete. In a conversation circle the
entity can only call gates; here the medium is JavaScript (QuickJS in its own
worker process), so it writes programs, and the gates are functions inside
them. The data stays in the sandbox as a variable -- the entity explores it
with code instead of holding it in the prompt -- and variables persist from
turn to turn (MEDIUM-3). A mistake in the code is an observation like any
other: the entity reads the error and fixes its program.
"""

from __future__ import annotations

from _grimoire import choose_llm, print_loom

import cantrip
from gates import done
from mediums import JsMedium

SALES = [
    {"month": month, "category": category, "units": units}
    for month, figures in (
        ("jan", {"tea": 120, "coffee": 300, "cocoa": 80}),
        ("feb", {"tea": 140, "coffee": 280, "cocoa": 60}),
        ("mar", {"tea": 170, "coffee": 250, "cocoa": 45}),
    )
    for category, units in figures.items()
]


@cantrip.gate
def sales_data() -> list[dict[str, object]]:
    """All monthly sales rows: month, category, units."""
    return SALES


# The offline script: what an entity writes, turn by turn. Turn 1 loads the data
# into a variable; turn 2 has a typo (the error comes back as an observation);
# turn 3 fixes it, reusing `rows` from turn 1; turn 4 finishes.
SCRIPT = [
    {"code": "var rows = sales_data(); console.log(rows.length + ' rows'); rows[0]"},
    {"code": "var byCat = {}; rows.forEach(r => byCat[r.categroy].push(r.units)); byCat"},
    {
        "code": "var byCat = {};\n"
        "rows.forEach(r => (byCat[r.category] = byCat[r.category] || []).push(r.units));\n"
        "var trend = Object.entries(byCat).map(([c, u]) => `${c} ${u[0]}->${u[u.length-1]}`);\n"
        "trend"
    },
    {"code": "done('Tea is growing, coffee and cocoa are falling: ' + trend.join(', '))"},
]

circle = cantrip.Circle(
    gates=[sales_data, done],  # G: the crossings out of the sandbox
    wards=[cantrip.max_turns(8)],  # W: the loop will end
    medium=JsMedium(max_eval_ms=2000),  # M: JavaScript, each eval limited to 2 s
)
spell = cantrip.Cantrip(
    llm=choose_llm(SCRIPT),
    identity=cantrip.Identity(
        system_prompt="You analyse data by writing JavaScript. Keep data in variables; "
        "finish with done(summary)."
    ),
    circle=circle,
)
outcome = spell.cast("Analyse each category's sales and summarise the overall trend.")

print("result:", outcome.result)
for turn in outcome.turns:  # what the circle answered each program with
    first_line = turn.observation.strip().splitlines()[-1]
    print(f"  turn {turn.sequence} observation ends: {first_line[:90]}")
print_loom(spell.loom)
