"""A.8 Folding -- a long-running entity's older turns leave its view, not the loom.

    python examples/grimoire/08_folding.py

What to notice: with a folding policy, once more than four turns are in view
the older ones are replaced by one marked summary, so each query stays small
while the loom keeps every turn (LOOM-5). The identity, the intent and the
gate definitions are never folded (LOOM-6). In a code circle what the entity
learned lives on as program state: the `errors` tally built in turns that
were folded away is still there for the last turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from _grimoire import choose_llm, print_loom

import cantrip
from cantrip import LLM, Message, Response, ToolDefinition
from cantrip._folding import FoldingPolicy
from gates import done
from mediums import JsMedium

PAGES = [
    ["INFO boot", "ERROR disk full", "INFO retry"],
    ["ERROR disk full", "WARN slow query"],
    ["INFO ok", "ERROR timeout talking to db"],
    ["ERROR disk full", "INFO ok"],
    ["WARN slow query", "ERROR timeout talking to db"],
    ["INFO shutdown"],
]


@cantrip.gate
def read_log(page: int) -> list[str]:
    """One page of the server log (pages 0 to 5)."""
    if not 0 <= page < len(PAGES):
        raise cantrip.GateError(f"there is no page {page}; pages are 0 to {len(PAGES) - 1}")
    return PAGES[page]


class Watched:
    """Wraps any LLM and remembers how many messages each query carried."""

    def __init__(self, inner: LLM) -> None:
        self.inner = inner
        self.name = inner.name
        self.sizes: list[int] = []
        self.last: list[Message] = []

    async def query(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        tool_choice: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Response:
        self.sizes.append(len(messages))
        self.last = list(messages)
        return await self.inner.query(messages, tools, tool_choice, extra)


# One page per turn; the tally lives in the sandbox variable `errors`.
SCRIPT = [{"code": "var errors = {}; var page = 0; 'ready'"}]
SCRIPT += [
    {
        "code": f"read_log({page}).filter(l => l.startsWith('ERROR'))"
        ".forEach(l => errors[l] = (errors[l] || 0) + 1); page += 1; errors"
    }
    for page in range(6)
]
SCRIPT += [{"code": "read_log(6)"}]  # one page too far: an error observation
SCRIPT += [
    {
        "code": "var top = Object.entries(errors).sort((a, b) => b[1] - a[1]);\n"
        "done(`${page} pages read; most frequent: ${top[0][0]} (${top[0][1]}x)`)"
    }
]

llm = Watched(choose_llm(SCRIPT))
spell = cantrip.Cantrip(
    llm=llm,
    identity=cantrip.Identity(
        system_prompt="You read logs one page at a time with JavaScript, keeping tallies in "
        "variables. Finish with done(summary)."
    ),
    circle=cantrip.Circle([read_log, done], [cantrip.max_turns(15)], JsMedium()),
    # The folding policy: more than 4 turns in view -> fold all but the last 2.
    folding=FoldingPolicy(trigger_after_turns=4, keep_recent=2),
)
outcome = spell.cast("Read the whole server log and tell me which error happens most often.")

print("result:", outcome.result)
print("messages per query:", llm.sizes)  # it grows, folds, grows, folds...
print("the last query began with:")
for message in llm.last[:3]:
    print(f"  [{message.role}] {(message.content or '').splitlines()[0][:80]}")
print(
    "turns in the loom:",
    len(spell.loom),
    "| turns the last query showed in full:",
    sum(1 for m in llm.last if m.role == "assistant"),
)
print_loom(spell.loom)
