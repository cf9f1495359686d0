"""Built-in gates, one module each. Users write theirs the same way (``cantrip.gate``)."""

from __future__ import annotations

from cantrip import Gate
from cantrip.delegation import register_gates
from gates.ask_user import ask_user
from gates.call_agent import call_agent, call_agent_batch
from gates.done import done
from gates.echo import echo
from gates.fetch import fetch
from gates.memory import edit_block, forget, recall, remember
from gates.read import read

BUILTIN: dict[str, Gate] = {
    g.name: g
    for g in (
        done, echo, read, fetch, call_agent, call_agent_batch, ask_user,
        remember, recall, forget, edit_block,
    )
}  # fmt: skip
"""Gates a declarative spec can name."""

register_gates(*BUILTIN.values())  # ... and a child request (cantrip.delegation)

__all__ = [
    "BUILTIN",
    "ask_user",
    "call_agent",
    "call_agent_batch",
    "done",
    "echo",
    "edit_block",
    "fetch",
    "forget",
    "read",
    "recall",
    "remember",
]
