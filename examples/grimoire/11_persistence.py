"""A.11 Persistence -- a summoned entity survives its first intent.

    python examples/grimoire/11_persistence.py

What to notice: `summon` gives an entity that takes intent after intent
(ENTITY-5); the second intent builds on what the first left behind -- here the
`project` object in its JavaScript sandbox, and the conversation in its
context. The identity never changes. Closed, the entity refuses further
intents; but its loom is on disk, so a later session can resume it, with its
context (and its sandbox's variables) rebuilt from the loom.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio
from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import IntentError
from gates import done
from mediums import JsMedium

LOOM = Path(tempfile.mkdtemp(prefix="persist-")) / "project.db"


def make_spell(script: list[dict[str, str]]) -> cantrip.Cantrip:
    """The same cantrip each session: same identity and circle, one loom file."""
    return cantrip.Cantrip(
        llm=choose_llm(script),
        identity=cantrip.Identity(
            system_prompt="You plan software projects in JavaScript objects. Keep your plan in "
            "the variable `project`; finish each request with done(summary)."
        ),
        circle=cantrip.Circle([done], [cantrip.max_turns(6)], JsMedium()),
        loom=cantrip.Loom.open(LOOM),
    )


async def first_session() -> str:
    spell = make_spell(
        [
            {"code": "var project = {name: 'weather-cli', dirs: ['src', 'docs'], tests: []};\n"
                     "done('Set up ' + project.name + ' with ' + project.dirs.join(', '))"},
            {"code": "project.dirs.push('tests');\n"
                     "project.tests = ['test_forecast', 'test_units'];\n"
                     "done(project.tests.length + ' tests planned in ' + project.dirs.join(', '))"},
        ]
    )  # fmt: skip
    entity = spell.summon()
    async with entity:
        one = await entity.send("Set up the project structure for a weather CLI.")
        print("intent 1:", one.result)
        two = await entity.send("Now add the test suite.")  # `project` is still there
        print("intent 2:", two.result)
    try:  # the non-happy path: a closed entity takes no more intents
        await entity.send("One more thing...")
    except IntentError as error:
        print("refused:", error)
    spell.loom.close()
    return entity.id


async def later_session(entity_id: str) -> None:
    # A new process would do exactly this: build the cantrip, resume by id.
    spell = make_spell(
        [{"code": "done(project.name + ': ' + project.dirs.length + ' folders, tests: '"
                  " + project.tests.join(', '))"}]
    )  # fmt: skip
    async with spell.resume(entity_id) as entity:
        three = await entity.send("Remind me what we have so far.")
        print("after resuming:", three.result)
    print_loom(spell.loom)
    thread = spell.loom.thread(spell.loom.last_turn(entity_id).id)  # type: ignore[union-attr]
    print("one thread across both sessions:", [t.intent for t in thread if t.intent])
    spell.loom.close()


async def main() -> None:
    entity_id = await first_session()
    await later_session(entity_id)


if __name__ == "__main__":
    trio.run(main)
