"""Gate names for MCP tools that every LLM provider accepts.

An MCP server may name a tool anything (the MCP spec only advises letters,
digits, ``_``, ``-`` and ``.``); the providers refuse a whole request whose
tool list holds one name they do not accept, so a single tool called
``"get weather"`` or ``"fs/read"`` would fail every cast of the spec (issue 28,
item 9). The strictest rule the providers share (SPEC.md, MCP-2, with the
providers' documentation) is :data:`PROVIDER_NAME`: ASCII letters, digits,
``_`` and ``-``, at most 64, starting with a letter or ``_`` (Gemini).

A name that already follows it is kept as it is. Any other is mapped, stably
(the same tool always gets the same gate name, whatever else the server
lists) and without collisions: its characters outside the rule become ``_``,
it is cut to leave room, and ``_`` plus the first 8 hex digits of the
SHA-256 of the tool's own name is appended.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

PROVIDER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
"""The gate names every supported provider accepts (use with ``fullmatch``)."""

_OUTSIDE = re.compile(r"[^A-Za-z0-9_-]+")
_DIGEST = 8


def gate_name(prefix: str, tool: str) -> str:
    """The gate name for ``tool`` of a server whose gates are prefixed ``prefix``."""
    name = prefix + tool
    if PROVIDER_NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    safe = _OUTSIDE.sub("_", name)
    if not PROVIDER_NAME.match(safe[:1]):  # empty, or led by a digit or '-'
        safe = "_" + safe
    return f"{safe[: 64 - _DIGEST - 1]}_{digest}"


def gate_names(prefix: str, tools: Iterable[str]) -> dict[str, str]:
    """``tool -> gate name`` for every tool; raises ``ValueError`` naming the tools if
    two would share a gate name (only a tool literally named like another's mapped
    name can do that)."""
    names = {tool: gate_name(prefix, tool) for tool in tools}
    seen: dict[str, str] = {}
    for tool, name in names.items():
        if name in seen:
            raise ValueError(
                f"tools {seen[name]!r} and {tool!r} would both be the gate {name!r}; "
                "leave one out of the allow-list (tools = [...])"
            )
        seen[name] = tool
    return names
