"""A.9 Composition -- an entity delegates to child entities, in code.

    python examples/grimoire/09_composition.py

What to notice: in a code circle, delegation is a function call -- here a
batch over a list built on the fly. Children run concurrently and results
come back in request order (COMP-3). Each child gets its own circle
(COMP-4): its own medium, gates and wards, which can only be tighter than the
parent's (WARD-1). One request asks for something the circle refuses (a
child in an unsandboxed medium): that child's entry is an error, the others
succeed, and the parent retries the failed part. Parent and children share
one loom: delegation is one step of the parent's thread, and each child's
turns hang below it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import Message, Response, ToolCall, ToolDefinition
from gates import call_agent, call_agent_batch, done
from mediums import JsMedium


class WordCounter:
    """The children's LLM offline: a tiny rule-based model. It reads its intent and
    answers done(<number of words after the colon>) -- any object with query() is
    an LLM (spec 2.1); a real model can stand in for it unchanged."""

    name = "worker"

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        intent = next(m.content or "" for m in messages if m.role == "user")
        text = intent.split(":", 1)[-1]
        count = len(re.findall(r"[A-Za-z']+", text))
        return Response(tool_calls=(ToolCall("w1", "done", {"answer": count}),))


CHAPTERS = {
    "one": "It was a dark and stormy night",
    "two": "the rain fell in torrents",
    "three": "except at occasional intervals, when it was checked by a violent gust of wind",
}

PARENT_SCRIPT = [
    {  # split the task, fan out; chapter three asks for a bash child: refused
        "code": "var chapters = " + repr(CHAPTERS).replace("'", '"') + ";\n"
        "var names = Object.keys(chapters);\n"
        "var requests = names.map(n => ({\n"
        "  intent: 'Count the words of this text: ' + chapters[n],\n"
        "  llm: 'worker', gates: ['done'], wards: [{max_turns: 2}],\n"
        "  medium: n === 'three' ? 'bash' : 'conversation'}));\n"
        "var counts = call_agent_batch(requests);\n"
        "counts"
    },
    {  # adapt: retry the failed part alone, in a sandboxed medium
        "code": "names.forEach((n, i) => { if (counts[i] && counts[i].error) {\n"
        "  counts[i] = call_agent({intent: 'Count the words of this text: ' + chapters[n],\n"
        "                          llm: 'worker', gates: ['done'], medium: 'conversation'});\n"
        "}});\n"
        "counts"
    },
    {  # merge
        "code": "var total = counts.reduce((a, b) => a + Number(b), 0);\n"
        "done(names.map((n, i) => n + ': ' + counts[i]).join(', ') + '; total ' + total)"
    },
]

spell = cantrip.Cantrip(
    llm=choose_llm(PARENT_SCRIPT),
    identity=cantrip.Identity(
        system_prompt="You split work into parts and delegate each part to a child entity "
        "with call_agent_batch, then merge the answers. Finish with done(summary)."
    ),
    circle=cantrip.Circle(
        gates=[call_agent, call_agent_batch, done],
        wards=[cantrip.max_turns(6), cantrip.max_depth(1)],  # children cannot delegate again
        medium=JsMedium(),
    ),
    llms={"worker": choose_llm(WordCounter(), name="worker")},  # the children's LLM, by name
)
outcome = spell.cast("Count the words of each chapter of the story, and the total.")

print("result:", outcome.result)
parent = spell.loom.entity(outcome.entity_id)
children = [r for r in spell.loom.entities.values() if r.parent_entity_id == parent.entity_id]
print(f"children: {len(children)}, media: {sorted({c.medium for c in children})}")
batch = next(r for t in outcome.turns for r in t.gate_calls if r.gate == "call_agent_batch")
print("the batch's results, in request order:", batch.result)
print_loom(spell.loom)
