"""``done``: the gate every circle has. Calling it ends the loop (CIRCLE-1/8)."""

from __future__ import annotations

from typing import Any

from cantrip import gate


@gate(terminates=True, aliases=("submit_answer",))
def done(answer: Any) -> Any:
    """Finish the task and return ``answer`` as the result. Call it once, last."""
    return answer
