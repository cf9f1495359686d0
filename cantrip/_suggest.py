"""Words a user reads about their own mistakes: a close match, and no rule ids.

A misspelt key, gate or ward is named with the nearest known name ("did you
mean 'echo'?"), found by :mod:`difflib`'s ratio. Rule ids such as ``(INTENT-1)``
or ``(CIRCLE-2, LOOP-2)`` tie an error to SPEC.md for maintainers; the command
line shows them only with ``--debug`` (:func:`without_rule_ids`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

_RULE_IDS = re.compile(r"\s*\((?:[A-Z]{1,8}-\d+[a-z]?)(?:,\s*[A-Z]{1,8}-\d+[a-z]?)*\)")
"""A parenthesised list of rule ids: ``(LOOP-2)``, ``(CIRCLE-2, LOOP-2)``, ``(D-011)``."""


def close_match(word: str, known: Iterable[str]) -> str | None:
    """The known name nearest to ``word``, if one is close enough to be a typo."""
    matches = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` -- did you mean 'x'?`` for the nearest known name, or ``""``."""
    match = close_match(word, known)
    return f" -- did you mean {match!r}?" if match is not None else ""


def without_rule_ids(text: str) -> str:
    """``text`` with its parenthesised spec rule ids removed."""
    return _RULE_IDS.sub("", text)
