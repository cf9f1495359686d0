"""A.4 Cantrip -- LLM, identity and circle bound into a reusable value.

    python examples/grimoire/04_cantrip.py

What to notice: two casts of one cantrip are two independent entities
(CANTRIP-2), both recorded in the cantrip's loom as separate threads. The
identity is fixed (IDENTITY-1); only the intent varies (INTENT-1). A cantrip
missing a part cannot be built (CANTRIP-1), and neither can a cast without
an intent.
"""

from __future__ import annotations

from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import ConstructionError, ImmutableError, IntentError
from gates import done


@cantrip.gate
def add(a: float, b: float) -> float:
    """Add two numbers exactly."""
    return a + b


# The three parts, each built where you can see it.
llm = choose_llm(  # the LLM (offline: a script covering both casts below)
    [
        {"tool_calls": [{"gate": "add", "args": {"a": 2, "b": 3}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "5"}}]},
        {"tool_calls": [{"gate": "add", "args": {"a": 10, "b": 20}}]},
        {"tool_calls": [{"gate": "done", "args": {"answer": "30"}}]},
    ]
)
identity = cantrip.Identity(  # who the entity is: fixed once built
    system_prompt="You are a careful calculator. Use the add gate, never mental arithmetic, "
    "then call done with the number.",
    temperature=0.0,
)
circle = cantrip.Circle([add, done], [cantrip.max_turns(6)])  # where it acts

spell = cantrip.Cantrip(llm=llm, identity=identity, circle=circle)

# One value, cast twice: two entities, two threads.
first = spell.cast("What is 2 + 3?")
second = spell.cast("What is 10 + 20?")
print(f"cast 1: {first.result!r} by {first.entity_id}")
print(f"cast 2: {second.result!r} by {second.entity_id}")
print("independent entities:", first.entity_id != second.entity_id)

# The non-happy paths.
try:
    identity.system_prompt = "You are a pirate."  # type: ignore[misc]
except (ImmutableError, AttributeError) as error:
    print("identity refused a change:", type(error).__name__)
try:
    cantrip.Cantrip(llm=llm, identity=identity, circle=None)  # type: ignore[arg-type]
except ConstructionError as error:
    print("cantrip refused:", error)
try:
    spell.cast("   ")
except IntentError as error:
    print("cast refused:", error)

print_loom(spell.loom)
print("threads in the loom:", len(spell.loom.threads()))
