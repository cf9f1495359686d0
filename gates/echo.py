"""``echo``: returns its text. Handy for tests, demos and a first circle."""

from __future__ import annotations

from cantrip import gate


@gate
def echo(text: str) -> str:
    """Return ``text`` unchanged."""
    return text
