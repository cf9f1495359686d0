"""A.2 Gate -- a host function with metadata, tested on its own, then at the circle.

    python examples/grimoire/02_gate.py

What to notice: a gate is an ordinary function; its JSON Schema (what the
entity sees) comes from the type hints. Arguments are validated before it
runs. A gate that raises does not crash anything: at the circle's boundary
the exception becomes observation data (CIRCLE-5). Dependencies such as a
filesystem root are bound when the circle is built (CIRCLE-10), and a circle
with an unbound one is refused.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import trio

import cantrip
from cantrip import ConstructionError, GateArgumentError, GateError
from gates import done  # the built-in done gate: every circle needs it (CIRCLE-1)


# A gate: name, description (the docstring) and parameters (the type hints).
@cantrip.gate
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


# A gate that closes over state given at construction: `root` is a dependency,
# not a parameter -- the entity never sees it and cannot change it.
@cantrip.gate(dependencies=("root",))
def read_note(name: str, root: Path) -> str:
    """Read one note by name."""
    path = root / f"{name}.txt"
    if not path.exists():
        raise GateError(f"there is no note called {name!r}")
    return path.read_text()


async def main() -> None:
    # 1. What the LLM is shown: the gate's definition.
    print("schema:", json.dumps(add.definition().to_dict()["parameters"]))

    # 2. Run it directly, as a test would.
    print("add(2, 3) =", await add.invoke({"a": 2, "b": 3}))

    # 3. Bad arguments are refused before the function runs.
    try:
        await add.invoke({"a": "two", "b": 3})
    except GateArgumentError as error:
        print("refused:", error)

    # 4. Dependencies are bound at construction (CIRCLE-10) ...
    notes = Path(tempfile.mkdtemp())
    (notes / "groceries.txt").write_text("bread, milk, apples")
    bound = read_note.bind(root=notes)
    circle = cantrip.Circle([done, add, bound], [cantrip.max_turns(5)])

    # ... and a circle turns the gate's own failures into observations (CIRCLE-5).
    ok = await circle.call("read_note", {"name": "groceries"})
    failed = await circle.call("read_note", {"name": "todo"})
    for record in (ok, failed):
        print(
            f"circle.call {record.gate}{dict(record.args)}: {record.result!r} "
            f"(is_error={record.is_error})"
        )

    # 5. The non-happy path at construction: a gate whose dependency is unbound.
    try:
        cantrip.Circle([done, read_note], [cantrip.max_turns(5)])
    except ConstructionError as error:
        print("circle refused:", error)

    print("\n--- the loom recorded: nothing -- gates ran without an entity ---")


if __name__ == "__main__":
    trio.run(main)
