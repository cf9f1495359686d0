"""``ask_user``: ask the human a question and wait for the answer (opt-in).

Listed in a circle like any gate. A call pauses the entity (see
``cantrip._approval``): the question is recorded in the loom as a pending
pause, every front end shows it, and the human's answer becomes the call's
observation -- seconds or days later, across restarts.
"""

from __future__ import annotations

from cantrip import GateError, gate


@gate(asks_user=True)
def ask_user(question: str) -> str:
    """Ask the human a question and wait for the answer; use it when you need facts or a
    choice only the user has. The answer is returned as text."""
    # The entity answers this gate from the human's reply; its body runs only when
    # a circle is used without the runtime's pause handling (never in cantrip).
    raise GateError("ask_user needs a human to answer, and none is attached")
