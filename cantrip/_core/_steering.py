"""Steering: messages sent to a running cast, waiting for its next turn.

:meth:`Entity.steer` drops a message here; the loop takes what waits at the
start of each turn, adds it to the context as a user message and records it
in that turn's ``extras["steering"]``. A message never outlives the cast it
was sent to: what no turn took is reported as the result's ``undelivered``.
"""

from __future__ import annotations

import attrs

from cantrip._errors import IntentError
from cantrip._outcome import CastResult


class Steering:
    """The messages waiting for the running cast's next turn."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: list[str] = []

    def send(self, text: str, *, running: bool) -> bool:
        """Queue ``text`` for the running cast; whether one was running to take it."""
        text = text.strip()
        if not text:
            raise IntentError("a steering message needs some text")
        if not running:
            return False
        self.waiting.append(text)
        return True

    def take(self) -> tuple[str, ...]:
        """Everything waiting, for the turn about to be taken."""
        taken = tuple(self.waiting)
        self.waiting.clear()
        return taken

    def undelivered(self, result: CastResult) -> CastResult:
        """``result`` with the messages no turn took, as ``undelivered``."""
        if not self.waiting:
            return result
        return attrs.evolve(result, undelivered=tuple(self.waiting))

    def clear(self) -> None:
        self.waiting.clear()
