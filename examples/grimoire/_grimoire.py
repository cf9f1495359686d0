"""What every grimoire example shares: the choice of LLM, and a look at the loom.

The examples assemble everything else -- identity, gates, wards, circle,
cantrip -- in plain sight. Two things live here so they are the same in all
twelve: **which LLM answers** (the one place to change it) and **how the loom
is printed** afterwards.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from cantrip import LLM, Loom, ScriptedLLM

# ---------------------------------------------------------------------------------
# THE ONE PLACE THE GRIMOIRE CHOOSES ITS LLM.
#
# Offline (the default, and always under `--offline` or CANTRIP_OFFLINE=1): a
# ScriptedLLM replays the responses each example wrote for it, so every example
# runs without a network and prints the same thing every time.
#
# Online: when one of these keys is in the environment, the example's LLM is
# that provider's model instead (CANTRIP_MODEL picks the model; otherwise the
# provider's default), built by the provider layer in cantrip/llm/providers.
# A real model writes its own turns, so what it does differs from the script.
# ---------------------------------------------------------------------------------
PROVIDER_KEYS = {
    "OPENAI_API_KEY": "openai",
    "ANTHROPIC_API_KEY": "anthropic",
    "GEMINI_API_KEY": "gemini",
    "OPENROUTER_API_KEY": "openrouter",
}


def offline() -> bool:
    return os.environ.get("CANTRIP_OFFLINE") == "1" or "--offline" in sys.argv


def choose_llm(offline_llm: Sequence[Mapping[str, Any]] | LLM, *, name: str = "llm") -> LLM:
    """The LLM an example runs with: a real provider when a key is set, else
    ``offline_llm`` (a script for a ScriptedLLM, or an LLM object)."""
    if not offline():
        for variable, provider in PROVIDER_KEYS.items():
            if os.environ.get(variable):
                try:
                    from cantrip.llm._config import load_llm
                except ImportError:
                    print(f"({variable} is set, but this cantrip has no provider layer yet)")
                    break
                model = os.environ.get("CANTRIP_MODEL")
                llm: LLM = load_llm(provider, model, name=name)
                print(f"(LLM: {provider} {getattr(llm, 'model', '')}, live)")
                return llm
    if isinstance(offline_llm, LLM):
        return offline_llm
    return ScriptedLLM(list(offline_llm), name=name)


def print_loom(loom: Loom, title: str = "the loom recorded") -> None:
    """Every turn of the loom, grouped by entity: what was called, how it ended."""
    count = len(loom.entities)
    entities = f"{count} entit{'y' if count == 1 else 'ies'}"
    print(f"\n--- {title}: {len(loom)} turn(s), {entities} ---")
    for entity_id, record in loom.entities.items():
        turns = loom.entity_turns(entity_id)
        parent = f" (child of {record.parent_entity_id})" if record.parent_entity_id else ""
        print(f"{entity_id}{parent}: {len(turns)} turn(s), medium {record.medium}")
        for turn in turns:
            calls = ", ".join(
                f"{r.gate}{'' if r.status == 'ok' else ' [' + r.status + ']'}"
                for r in turn.gate_calls
            )
            end = "terminated" if turn.terminated else "truncated" if turn.truncated else ""
            reason = f" -> {end} ({turn.reason})" if end else ""
            if turn.reason == "delegating":
                reason = " -> delegating (its children's turns hang below this one)"
            if turn.extras.get("error"):
                reason += " [the code raised an error]"
            intent = f"  intent: {turn.intent!r}\n" if turn.intent else ""
            print(f"{intent}  turn {turn.sequence}: gates [{calls}]{reason}")
