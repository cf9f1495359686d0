"""``remember``, ``recall``, ``forget``, ``edit_block``: memory across sessions.

They work on the memory of the cantrip the entity belongs to (``Cantrip(memory=...)``,
a spec's ``[memory]`` table), in the namespace of the running cast (its user, the
entity, the cantrip's name, as the cantrip's template says). Every item they write
names the turn that wrote it. Store calls run in worker threads (cantrip.memory);
a refusal -- a bound, a block over its limit, no memory at all -- is an ``is_error``
observation with the reason, and the loop goes on.
"""

from __future__ import annotations

from typing import Any

from cantrip import GateError, GateResult, gate
from cantrip.memory import MemoryStoreError, current_scope, describe


def _scope() -> Any:
    try:
        return current_scope()
    except MemoryStoreError as exc:
        raise GateError(str(exc)) from None


@gate
async def remember(key: str, value: Any) -> GateResult:
    """Remember value under key, across sessions. Recall searches the words of values,
    so write a fact as a sentence ("Alice's favourite colour is blue") under a short
    key ("favourite_colour"). Remembering a key again revises it."""
    entity, scope = _scope()
    try:
        item = await scope.remember(entity, key, value)
    except MemoryStoreError as exc:
        raise GateError(str(exc)) from None
    return GateResult(
        f"remembered {key!r} (revision {item.revision})",
        {"namespace": list(item.namespace), "key": key, "revision": item.revision},
    )


@gate
async def recall(query: str | None = None, limit: int = 5) -> list[dict[str, Any]]:
    """Search what you remember: the items best matching query (the newest without one)."""
    _, scope = _scope()
    try:
        items = await scope.recall(query, limit)
    except MemoryStoreError as exc:
        raise GateError(str(exc)) from None
    return [describe(item) for item in items]


@gate
async def forget(key: str) -> str:
    """Forget the item under key, with every revision of it."""
    _, scope = _scope()
    try:
        gone = await scope.forget(key)
    except MemoryStoreError as exc:
        raise GateError(str(exc)) from None
    return f"forgot {key!r}" if gone else f"nothing was remembered under {key!r}"


@gate
async def edit_block(label: str, new_text: str, old_text: str | None = None) -> GateResult:
    """Edit a pinned memory block (shown to you at the start of every task): replace
    old_text by new_text, or append new_text when old_text is left out."""
    entity, scope = _scope()
    try:
        text, revision = await scope.edit_block(entity, label, new_text, old_text)
    except MemoryStoreError as exc:
        raise GateError(str(exc)) from None
    return GateResult(f'block "{label}" now reads:\n{text}', {"label": label, "revision": revision})
