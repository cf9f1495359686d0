"""A.3 Circle -- gates and wards assembled into an environment.

    python examples/grimoire/03_circle.py

What to notice: the errors. A circle without `done` is refused when it is
built (CIRCLE-1); so is a circle with no ward that guarantees the loop ends
(CIRCLE-2). The circle makes misbehaviour impossible instead of waiting for
it to happen. A valid circle is then cast once, to show it working.
"""

from __future__ import annotations

from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import ConstructionError
from gates import done


@cantrip.gate
def greet(name: str) -> str:
    """Greet someone by name."""
    return f"Hello, {name}!"


# The non-happy paths first: two circles that cannot be built.
for gates, wards, what in (
    ([greet], [cantrip.max_turns(10)], "no done gate"),
    ([greet, done], [], "no truncating ward"),
):
    try:
        cantrip.Circle(gates, wards)
    except ConstructionError as error:
        print(f"refused ({what}): {error}")

# A circle that can be built: its gate set, and a ward that guarantees termination.
circle = cantrip.Circle(
    gates=[greet, done],
    wards=[cantrip.max_turns(10)],  # at most 10 turns, whatever the entity does
)
print("medium:", circle.medium.name, "| gates:", circle.gate_names)
print("the entity is offered:", [tool.name for tool in circle.tools()])

spell = cantrip.Cantrip(
    llm=choose_llm(
        [
            {"tool_calls": [{"gate": "greet", "args": {"name": "Ada"}}]},
            {"tool_calls": [{"gate": "greet", "args": {"name": "Grace"}}]},
            {"tool_calls": [{"gate": "done", "args": {"answer": "Greeted Ada and Grace."}}]},
        ]
    ),
    identity=cantrip.Identity(
        system_prompt="You greet people with the greet gate, then call done."
    ),
    circle=circle,
)
outcome = spell.cast("Greet Ada and Grace, one at a time, then report what you did.")
print("\nresult:", outcome.result, "| terminated:", outcome.terminated)
print_loom(spell.loom)
