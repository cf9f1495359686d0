"""Tool-call ids in each provider's syntax: a canonical id projected, and an id checked.

Why apart from the renderer: the id rules of the five formats (which ids a
provider accepts as they are, how any other is hashed into its syntax, Kimi's
``functions.<name>:<index>``) are one piece of knowledge that both the
renderer (:func:`project_id`) and the validator (:func:`id_problems`) apply;
here they are written once.
"""

from __future__ import annotations

import hashlib
import re

from cantrip.llm._contract import ToolCall
from cantrip.llm._transcript_model import ProviderFormat, unknown_format

_OPENAI_ID = re.compile(r"call_[A-Za-z0-9_-]+")
_ANTHROPIC_ID = re.compile(r"toolu_[A-Za-z0-9_-]+")
_GEMINI_ID = re.compile(r"[A-Za-z0-9_-]+")
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_KIMI_ID = re.compile(r"functions\.([A-Za-z0-9_-]+):(\d+)")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")
_MAX_LEN: dict[str, int] = {"openai": 40, "anthropic": 64, "gemini": 64}
_PREFIX: dict[str, str] = {"openai": "call_", "anthropic": "toolu_", "gemini": "fc_"}
_NATIVE: dict[str, re.Pattern[str]] = {
    "openai": _OPENAI_ID,
    "anthropic": _ANTHROPIC_ID,
    "gemini": _GEMINI_ID,
    "mistral": _MISTRAL_ID,
}
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def kimi_name(name: str) -> str:
    """The tool name as it appears in a Kimi id: ``[A-Za-z0-9_-]+``."""
    return _UNSAFE_NAME.sub("_", name) or "tool"


def _is_native(candidate: str, provider: str) -> bool:
    pattern = _NATIVE.get(provider)
    if pattern is None or pattern.fullmatch(candidate) is None:
        return False
    return len(candidate) <= _MAX_LEN.get(provider, 9)


def _hashed(seed: str, provider: str, attempt: int) -> str:
    data = seed if attempt == 0 else f"{seed}\x00{attempt}"
    if provider == "mistral":
        number = int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")
        chars = []
        for _ in range(9):
            number, digit = divmod(number, 62)
            chars.append(_BASE62[digit])
        return "".join(chars)
    return _PREFIX[provider] + hashlib.blake2b(data.encode(), digest_size=12).hexdigest()


def project_id(
    canonical_id: str, provider: ProviderFormat, *, index: int, name: str, taken: set[str]
) -> str:
    """The provider id of one call; adds it to ``taken``.

    ``index`` is the call's global position among all calls of the transcript
    (0-based), ``name`` its tool name, ``taken`` the ids already given out in
    this render. Deterministic: the same arguments give the same id.

    * ``kimi``: ``functions.{name}:{index}`` (the name reduced to
      ``[A-Za-z0-9_-]``); the index makes it unique.
    * Otherwise an id already valid for the format is kept as it is (``call_…``
      up to 40 characters for ``openai``; ``toolu_…`` up to 64 for ``anthropic``;
      ``[A-Za-z0-9_-]`` up to 64 for ``gemini``; exactly 9 alphanumerics for
      ``mistral``); any other id becomes the format's prefix plus a BLAKE2b hash
      of it (``call_``/``toolu_``/``fc_`` + 24 hex digits; 9 base-62 digits for
      ``mistral``). An empty id hashes ``index`` and ``name`` instead.
    * When the candidate is already in ``taken`` (a reused canonical id, a
      hash collision) it is hashed again with an attempt counter until free.
    """
    if provider == "kimi":
        base = kimi_name(name)
        candidate = f"functions.{base}:{index}"
        while candidate in taken:  # unreachable within one render: indexes are unique
            index += 1
            candidate = f"functions.{base}:{index}"
        taken.add(candidate)
        return candidate
    if provider not in _NATIVE:
        raise unknown_format(provider)
    if canonical_id and _is_native(canonical_id, provider) and canonical_id not in taken:
        taken.add(canonical_id)
        return canonical_id
    seed = canonical_id if canonical_id else f"\x00empty\x00{index}\x00{name}"
    attempt = 0
    candidate = _hashed(seed, provider, attempt)
    while candidate in taken:
        attempt += 1
        candidate = _hashed(seed, provider, attempt)
    taken.add(candidate)
    return candidate


def id_problems(call: ToolCall, provider: ProviderFormat, ordinal: int, where: int) -> list[str]:
    cid = call.id
    if not cid:
        return [f"message {where}: tool call to {call.name!r} has an empty id"]
    if provider == "kimi":
        match = _KIMI_ID.fullmatch(cid)
        if match is None:
            return [f"message {where}: kimi tool call id {cid!r} is not functions.<name>:<index>"]
        problems = []
        if match.group(1) != kimi_name(call.name):
            problems.append(
                f"message {where}: kimi tool call id {cid!r} names "
                f"{match.group(1)!r}, the call is to {call.name!r}"
            )
        if int(match.group(2)) != ordinal:
            problems.append(
                f"message {where}: kimi tool call id {cid!r} has index {match.group(2)}, "
                f"expected the global call index {ordinal}"
            )
        return problems
    if _is_native(cid, provider):
        return []
    rules = {
        "openai": "call_ followed by [A-Za-z0-9_-], at most 40 characters",
        "anthropic": "toolu_ followed by [A-Za-z0-9_-], at most 64 characters",
        "gemini": "[A-Za-z0-9_-], at most 64 characters",
        "mistral": "exactly 9 letters or digits",
    }
    return [f"message {where}: {provider} tool call id {cid!r} is not {rules[provider]}"]
