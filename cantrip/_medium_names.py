"""Mediums by name: what spec files and child requests may write (``medium = "js"``).

Its own module, below both the spec-file layer and composition, so a child's
medium is found by name without composition importing the spec-file layer
(which imports the gates, which import composition).
"""

from __future__ import annotations

from collections.abc import Callable

from cantrip._errors import ConstructionError
from cantrip._install import require_extra
from cantrip.medium import Medium
from mediums.bash import BashMedium
from mediums.conversation import conversation

MEDIUM_ALIASES: dict[str, str] = {
    "conversation": "conversation",
    "tool": "conversation",
    "tool_calling": "conversation",
    "tools": "conversation",
    "code": "js",
    "javascript": "js",
    "js": "js",
    "python": "python",
    "py": "python",
    "bash": "bash",
    "shell": "bash",
}

MediumFactory = Callable[[], Medium]


def _js() -> Medium:
    """The js medium: QuickJS is the ``js`` extra, imported only when a spec asks."""
    require_extra("js", "the js medium")
    from mediums.js import js

    return js


def _python() -> Medium:
    """The python medium: monty is the ``python`` extra, imported only when asked."""
    require_extra("python", "the python medium")
    from mediums.python import python

    return python


_MEDIUMS: dict[str, MediumFactory] = {
    "conversation": lambda: conversation,
    "js": _js,
    "python": _python,
    "bash": BashMedium,  # opt-in only: not a sandbox (see mediums.bash)
}


def register_medium(name: str, factory: MediumFactory, *aliases: str) -> None:
    """Make a medium nameable from spec files (``medium = "name"``)."""
    _MEDIUMS[name] = factory
    MEDIUM_ALIASES[name] = name
    for alias in aliases:
        MEDIUM_ALIASES[alias] = name


def resolve_medium_name(name: str) -> Medium:
    """A medium by (alias) name, as spec files and child requests give it."""
    canonical = MEDIUM_ALIASES.get(name)
    if canonical is None or canonical not in _MEDIUMS:
        available = ", ".join(sorted(k for k, v in MEDIUM_ALIASES.items() if v in _MEDIUMS))
        raise ConstructionError(f"unknown medium {name!r} (available: {available})")
    return _MEDIUMS[canonical]()


__all__ = ["MEDIUM_ALIASES", "MediumFactory", "register_medium", "resolve_medium_name"]
